#!/bin/sh
# Records PROGRAM from the moment it stops itself (raise(SIGSTOP)): strace
# attaches to the stopped process, so what it mapped before is pre-trace.
# Usage: record-attached.sh LOG PROGRAM > program-output
set -e
log=$1; shift
"$@" &
pid=$!
while ! grep -q '^State:.*T' /proc/$pid/status 2>/dev/null; do sleep 0.05; done
strace -y -e trace=mmap,munmap,mprotect,mremap,brk,madvise -o "$log" -p $pid 2>/dev/null &
spid=$!
sleep 0.5
kill -CONT $pid
wait $pid
wait $spid
