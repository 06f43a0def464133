package php

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sonde-profiler/sonde/internal/procfs"
	"github.com/sonde-profiler/sonde/trace"
)

// PoolAttribute is the resource attribute naming a php-fpm worker's pool, which users
// filter by as they configure by it (one pool per site or application).
const PoolAttribute = "php.fpm.pool"

// Describe adds a php-fpm worker's pool to its process's attributes, from the title the
// worker gives itself ("php-fpm: pool www"), read from /proc/PID/cmdline. It implements
// trace.Describer. A worker that still has its master's title, just forked, is asked again
// later.
func (r *Runtime) Describe(p *trace.Process) bool {
	if !strings.HasPrefix(p.Name, "php-fpm") {
		return true
	}
	var pool string
	for try := 0; ; try++ {
		title, err := readTitle(fmt.Sprintf("/proc/%d/cmdline", p.PID))
		if err != nil {
			return true // gone: nothing more to say
		}
		var isWorker bool
		if pool, isWorker = strings.CutPrefix(title, "php-fpm: pool "); isWorker {
			break
		}
		// The master, or a worker just forked that has not renamed itself yet (sonde
		// reads a followed child at its fork): its parent is the master, and it renames
		// itself within a millisecond. A recycled worker may not live to the next
		// interval, when the describer would be asked again.
		if !parentIsFPM(p.PID) {
			return true
		}
		if try == retitleTries {
			return false
		}
		time.Sleep(retitleWait)
	}
	if p.Attributes == nil {
		p.Attributes = map[string]string{}
	}
	p.Attributes[PoolAttribute] = strings.ToValidUTF8(strings.TrimSpace(pool), "\uFFFD")
	return true
}

// How long Describe waits for a php-fpm worker just forked to take its pool's title:
// retitleTries times retitleWait at most, once per worker.
const (
	retitleTries = 10
	retitleWait  = time.Millisecond
)

// maxTitle bounds what is read of a process's title.
const maxTitle = 4096

func readTitle(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTitle))
	if err != nil {
		return "", err
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b), nil
}

// parentIsFPM tells whether a process's parent is a php-fpm.
func parentIsFPM(pid uint32) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	ppid, ok := procfs.StatParent(stat)
	if !ok {
		return false
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	return err == nil && bytes.HasPrefix(comm, []byte("php-fpm"))
}
