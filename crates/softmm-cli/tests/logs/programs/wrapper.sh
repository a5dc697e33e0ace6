#!/bin/sh
# A wrapper like pyenv's shims: finds the program (in a subshell, a fork
# that does not exec), then execs it with the other arguments.
prog=$(command -v "$1")
shift
exec "$prog" "$@"
