// Package php finds the Zend engine (PHP's interpreter) in the files processes map, tells
// the kernel how to walk its executor's frames, and names the frames the kernel recorded.
//
// An engine is a file exporting execute_ex and executor_globals: the php CLI, php-fpm, php-cgi
// or libphp.so of an embedding SAPI (Apache's module, FrankenPHP). Each file is inspected
// once per identity, whatever process maps it. The version comes from the file (its
// extension API number, "API20220829,NTS", and its "PHP/8.2.36" string); the engine's
// layouts from sonde's table of the versions it knows (layout.go), checked against the
// file's own code where a function reads a field (zend_is_executing reads the current
// frame's slot in executor_globals, zend_get_executed_filename_ex an op array's file), so
// that a build whose layout differs is refused rather than read wrong. Thread-safe (ZTS)
// builds keep the executor's globals per thread, behind TSRM, and are refused.
//
// The kernel records each PHP frame as its zend_function's address and the line of its
// current opline (package bpf, php.h). A Namer reads functions from the process as soon as
// stacks first show them: the function's name and its class's ("Dock::unload"), "{main}"
// for a script's body, "{closure}" as PHP names closures, and the file for user code.
// Functions are cached per image (one exec of a process) and address and checked again now
// and then: an op array freed at the end of a request (php-fpm without opcache) leaves its
// address to the next request's, which renews the image's interning space in the
// aggregator, so that old locations keep their names.
//
// Everything read from a process is hostile: lengths are bounded, strings must be the
// engine's strings, and a failed or nonsensical read leaves the frame unnamed and counted.
package php
