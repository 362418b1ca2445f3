/* host_backend.h - the host backend's pieces shared between its files. */
#ifndef RUDA_HOST_BACKEND_H
#define RUDA_HOST_BACKEND_H

#include <stdint.h>

#include "base/backend.h"

/* Collectives (host_comm.c): the backend ops of the same names. */
int ruda__host_comm_init(void *const *states, uint32_t n, void **ranks);
void ruda__host_comm_destroy(void *state, void *rank);
/* One rank of a communicator across processes: its transport does the work. */
int ruda__host_comm_init_rank(void *state, uint32_t nranks, uint32_t rank, const ruda_comm_id *id,
                              const ruda_comm_transport *transport, void **handle);
int ruda__host_collective(void *wstate, void *rank, const ruda__coll *k, ruda_error **err);

#endif /* RUDA_HOST_BACKEND_H */
