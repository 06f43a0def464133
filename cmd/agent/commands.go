package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sonde-profiler/sonde/reporter/top"
)

// commandsHelp lists sonde's commands in every usage text.
const commandsHelp = `Commands:
  sonde [flags]                         profile this host, or --pid processes, until stopped
  sonde record [flags] -- PROG [ARG...] run PROG and profile it and its children until it exits
  sonde top [flags]                     live view of the hottest functions, refreshed every second
  sonde view [flags] FILE...            print, filter, merge and convert profiles sonde wrote
  sonde version                         the version, Go's, and what this kernel supports
`

// errShowVersion is parseConfig's answer to --version.
var errShowVersion = errors.New("show version")

// dispatch runs the subcommand args name, if it names one.
func dispatch(args []string) (status int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "record":
		return recordMain(args[1:]), true
	case "top":
		return topMain(args[1:]), true
	case "view":
		return viewMain(args[1:], os.Stdout, os.Stderr), true
	case "version":
		return versionMain(args[1:], os.Stdout, os.Stderr), true
	case shimArg:
		return recordShim(args[1:]), true
	}
	return 0, false
}

// subcommand is a subcommand's flag set: flags of its own and agent flags it shares,
// which keep the agent's meaning, values and validation.
type subcommand struct {
	name  string
	fs    *flag.FlagSet
	agent *flag.FlagSet
	check func(*flag.FlagSet) (*config, error)
}

// newSubcommand starts the flag set of `sonde name`; synopsis and about head its help.
func newSubcommand(name, synopsis, about string, getenv func(string) string, stderr io.Writer) (*subcommand, error) {
	agent, check, err := agentFlags(getenv)
	if err != nil {
		return nil, err
	}
	fs := flag.NewFlagSet("sonde "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s\n\n%s\n\nFlags:\n", synopsis, about)
		fs.PrintDefaults()
	}
	return &subcommand{name: name, fs: fs, agent: agent, check: check}, nil
}

// share makes the agent's flag name one of the subcommand's. A non-empty def replaces its
// default and a non-empty usage its help, where the subcommand needs other ones.
func (s *subcommand) share(name, def, usage string) {
	f := s.agent.Lookup(name)
	if f == nil {
		panic("no agent flag " + name)
	}
	if def != "" {
		if err := f.Value.Set(def); err != nil {
			panic(fmt.Sprintf("default %q of --%s: %v", def, name, err))
		}
	}
	s.fs.Var(f.Value, name, cmp.Or(usage, f.Usage))
}

// parse parses args and validates the shared flags as the agent does. Arguments after
// the flags are left in s.fs.Args().
func (s *subcommand) parse(args []string) (*config, error) {
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	c, err := s.check(s.fs)
	if err != nil {
		return nil, err
	}
	// A one-off command reports to the terminal and files, never to a collector the
	// environment may name for the agent.
	c.Export = false
	return c, nil
}

// given reports whether flag name was on the command line.
func (s *subcommand) given(name string) bool {
	found := false
	s.fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// usageStatus reports a parse error the way the agent does and returns the exit status:
// 0 for --help, 2 for a usage error.
func usageStatus(name string, err error, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "sonde %s: %s\nRun 'sonde %s --help' for usage.\n", name, printable(err.Error()), name)
	return 2
}

// printable escapes what must not reach a terminal raw in each line of s: errors quote
// file names, paths and process names.
func printable(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = top.Printable(l)
	}
	return strings.Join(lines, "\n")
}
