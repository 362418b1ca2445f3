/* cuda_none.c - linked when the CUDA toolkit headers were not found: the
 * library still builds and runs with the host backend alone. */
#include "base/backend.h"

const ruda__backend_ops *const ruda__cuda_backend = NULL;
