package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// child is a process the benchmark started (a bridge or an informer). Its
// exit is watched from the start and the end of its log kept, so a start
// that fails says why at once instead of timing out, and a process can be
// stopped from anywhere without two calls to Wait.
type child struct {
	cmd    *exec.Cmd
	log    *logTail      // the end of its stderr and stdout, if kept
	exited chan struct{} // closed once it exited
	err    error         // how it exited, once exited is closed

	sigterms atomic.Int32 // SIGTERMs sent: 0 or 1
}

// startChild starts cmd, keeping the end of its output unless cmd already
// has somewhere to write it.
func startChild(cmd *exec.Cmd) (*child, error) {
	c := &child{cmd: cmd, exited: make(chan struct{})}
	if cmd.Stdout == nil && cmd.Stderr == nil {
		c.log = &logTail{max: 8 << 10}
		cmd.Stdout, cmd.Stderr = c.log, c.log
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	return c, nil
}

// waitHTTP waits until url answers 200 OK, and gives up at once if the
// process exits meanwhile.
func (c *child) waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := c.exitError(); err != nil {
			return err
		}
		if ok(url) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not OK after %s%s", url, timeout, c.logSuffix())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exitError is nil while the process runs, and says how it ended (with
// the end of its log) once it did.
func (c *child) exitError() error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s exited (%v)%s", c.cmd.Path, c.err, c.logSuffix())
	default:
		return nil
	}
}

func (c *child) logSuffix() string {
	if c.log == nil {
		return ""
	}
	if s := strings.TrimSpace(c.log.String()); s != "" {
		return "; the end of its log:\n" + s
	}
	return ""
}

// portTaken says whether the process exited because an address it was to
// listen on was in use: freeAddr closes the port it found, and another
// process may take it before the child listens on it.
func (c *child) portTaken() bool {
	select {
	case <-c.exited:
		return c.log != nil && strings.Contains(c.log.String(), "address already in use")
	default:
		return false
	}
}

// terminate asks the process to end: SIGTERM, once. A second one would
// make the bridge exit at once (controller-runtime's signal handler),
// skipping the graceful shutdown (its Leases released) that a handover's
// figures include.
func (c *child) terminate() {
	if c.sigterms.CompareAndSwap(0, 1) {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// stop terminates the process and waits for it.
func (c *child) stop() {
	c.terminate()
	c.wait()
}

// wait waits for the process to exit, and kills it after 30 seconds.
func (c *child) wait() {
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.kill()
	}
}

// kill kills the process and waits for it.
func (c *child) kill() {
	_ = c.cmd.Process.Kill() // fails only if it already exited
	<-c.exited
}

// logTail keeps the last max bytes written to it.
type logTail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *logTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *logTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// ok says whether url answers 200 OK.
func ok(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
