#!/bin/sh
# run_mpi.sh MPIEXEC NP PROGRAM [MPIEXEC FLAGS...] - runs PROGRAM on NP
# ranks; exits 77 (skipped) where mpirun cannot start processes at all
# (a container without what MPI needs), so that only ruda's failures fail.
set -u
mpiexec=$1 np=$2 prog=$3
shift 3
if ! timeout 60 "$mpiexec" "$@" -np 1 true >/dev/null 2>&1; then
  echo "mpirun cannot start a process here: skipped"
  exit 77
fi
exec timeout 110 "$mpiexec" "$@" -np "$np" "$prog"
