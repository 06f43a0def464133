// Package tools pins the linters make lint builds (staticcheck), in a module of their own so
// that their dependencies never change sonde's. It holds no code.
package tools
