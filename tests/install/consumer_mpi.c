/* A program outside the ruda tree linking libruda_mpi: its header, its
 * library and MPI's flags come from the package (or ruda_mpi.pc). It
 * runs without mpirun: it only checks that everything resolved. */
#include <ruda/mpi.h>
#include <stdio.h>

int main(void) {
  int up = 1;
  if (MPI_Initialized(&up) != MPI_SUCCESS) return 1;
  int (*init)(ruda_device *, MPI_Comm, ruda_comm **) = ruda_mpi_comm_init;
  printf("ruda %s with libruda_mpi (%s), MPI %s\n", ruda_version(), init != NULL ? "linked" : "missing",
         up ? "initialized" : "not initialized");
  return init == NULL;
}
