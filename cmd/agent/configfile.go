package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Every flag can also be set from a YAML file (--config FILE, or SONDE_CONFIG) and from
// an environment variable (SONDE_ and the flag's name in capitals, dashes as
// underscores: SONDE_OTLP_ENDPOINT). One precedence: flag, then environment, then file,
// then default. The OTEL_* variables sonde reads are defaults that all of these override.

// configEnvPrefix starts the environment variable of each flag.
const configEnvPrefix = "SONDE_"

// maxConfigSize bounds the configuration file read.
const maxConfigSize = 1 << 20

// envName is the environment variable that sets a flag.
func envName(flagName string) string {
	return configEnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// layer is one source of settings: flag name → values (a repeatable flag may have
// several), and a description of the source for error messages.
type layer struct {
	source string
	values map[string][]string
}

// configLayers reads the file and environment layers, lowest precedence first. Errors
// name the source and the bad key.
func configLayers(fs *flag.FlagSet, args []string, getenv func(string) string) ([]layer, error) {
	var layers []layer
	path := configPath(args, getenv)
	if path != "" {
		l, err := readConfigFile(fs, path)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	env := layer{source: "environment", values: map[string][]string{}}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		if v, ok := lookupEnv(getenv, envName(f.Name)); ok {
			env.values[f.Name] = []string{v}
		}
	})
	return append(layers, env), nil
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

// configPath finds --config among the arguments (before the flag set parses them, so
// that the file can be applied underneath them), else SONDE_CONFIG.
func configPath(args []string, getenv func(string) string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return getenv(envName("config"))
}

// readConfigFile reads a YAML mapping of flag names to values: scalars as the flag would
// take them on the command line, lists joined with commas (or one value each for a flag
// that may be given several times).
func readConfigFile(fs *flag.FlagSet, path string) (layer, error) {
	l := layer{source: "config file " + path, values: map[string][]string{}}
	data, err := readBounded(path, maxConfigSize)
	if err != nil {
		return l, fmt.Errorf("--config %s: %w", path, err)
	}
	var doc map[string]yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) { // an empty file is an empty configuration
		return l, fmt.Errorf("--config %s: not a YAML mapping of flag names to values: %w", path, err)
	}
	for key, node := range doc {
		f := fs.Lookup(key)
		if f == nil || key == "config" {
			return l, fmt.Errorf("--config %s: unknown key %q (keys are flag names, as in sonde --help)", path, key)
		}
		switch node.Kind {
		case yaml.ScalarNode:
			l.values[key] = []string{node.Value}
		case yaml.SequenceNode:
			var items []string
			for _, item := range node.Content {
				if item.Kind != yaml.ScalarNode {
					return l, fmt.Errorf("--config %s: key %q: a list of scalars, please", path, key)
				}
				items = append(items, item.Value)
			}
			if repeatable(key) {
				l.values[key] = items
			} else {
				l.values[key] = []string{strings.Join(items, ",")}
			}
		default:
			return l, fmt.Errorf("--config %s: key %q: want a value or a list of values", path, key)
		}
	}
	return l, nil
}

// repeatable flags take several values, one per use.
func repeatable(name string) bool { return name == "output" }

// applyLayers sets the flags from the layers, each layer over the ones before it, and
// returns the values of repeatable flags from the highest layer that has any. The command
// line, parsed after, wins over all of them.
func applyLayers(fs *flag.FlagSet, layers []layer) (map[string][]string, error) {
	repeated := map[string][]string{}
	for _, l := range layers {
		for name, values := range l.values {
			if repeatable(name) {
				repeated[name] = values
				continue
			}
			if err := fs.Set(name, values[len(values)-1]); err != nil {
				what := name
				if l.source == "environment" {
					what = envName(name)
				}
				return nil, fmt.Errorf("%s: %s: %w", l.source, what, err)
			}
		}
	}
	return repeated, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}
