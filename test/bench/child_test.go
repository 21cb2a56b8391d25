package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A process that exits before it is ready is reported at once, with how it
// exited and what it logged, not after the whole wait.
func TestChildSaysWhyItExited(t *testing.T) {
	c, err := startChild(exec.Command("sh", "-c", "echo 'listen tcp 127.0.0.1:9: bind: address already in use' >&2; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.waitHTTP("http://127.0.0.1:9/readyz", 20*time.Second)
	if err == nil {
		t.Fatal("no error from a process that exited")
	}
	for _, want := range []string{"exit status 3", "address already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if !c.portTaken() {
		t.Error("portTaken() = false for a process that could not listen")
	}
}

// A process that runs is not taken for one that exited, and stop ends it.
func TestChildStops(t *testing.T) {
	c, err := startChild(exec.Command("sleep", "600"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.exitError(); err != nil {
		t.Fatalf("a running process: %v", err)
	}
	if c.portTaken() {
		t.Error("portTaken() = true for a running process")
	}
	c.stop()
	if c.exitError() == nil {
		t.Error("still running after stop")
	}
}

// Stopping signals a process once, however often it is stopped: a second
// SIGTERM makes the bridge exit at once, skipping the graceful shutdown
// (its Leases released) that a handover's figures include.
func TestStopSignalsOnce(t *testing.T) {
	c, err := startChild(exec.Command("sleep", "600"))
	if err != nil {
		t.Fatal(err)
	}
	stopProcs([]*proc{{child: c}})
	c.stop()
	if n := c.sigterms.Load(); n != 1 {
		t.Errorf("%d SIGTERMs sent, want 1", n)
	}
}
