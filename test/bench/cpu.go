package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// controlPlaneCPU returns the CPU seconds (user and system) that this
// process's kube-apiserver and etcd children have used so far.
func controlPlaneCPU() float64 {
	var total float64
	for _, c := range stacktest.Children() {
		if c.Comm == "kube-apiserver" || c.Comm == "etcd" {
			total += processCPU(c.PID)
		}
	}
	return total
}

// processCPU returns the CPU seconds (user and system) process pid has used,
// from /proc/PID/stat (utime and stime, fields 14 and 15 of proc(5), in
// USER_HZ); 0 if the process is gone.
func processCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	line := string(b)
	fields := strings.Fields(line[strings.LastIndexByte(line, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (ut + st) / 100
}
