/* dlopen.c - libruda.so loaded after start-up, as a Python extension or a
 * plugin host loads it, then a large write staged through its private
 * jemalloc (the chunked write path) and read back. Not linked with ruda:
 * every entry point comes from dlsym. With Debian's jemalloc (initial-exec
 * TLS) the dlopen itself fails ("cannot allocate memory in static TLS
 * block"); the private build from RUDA_JEMALLOC_SOURCE uses the
 * global-dynamic model and loads. argv[1]: the library's path. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ruda/ruda.h"

#define SYM(lib, name) __typeof__(&name) p_##name = (__typeof__(&name))dlsym(lib, #name)

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libruda.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  SYM(lib, ruda_config_init);
  SYM(lib, ruda_device_open);
  SYM(lib, ruda_device_close);
  SYM(lib, ruda_buffer_create);
  SYM(lib, ruda_write);
  SYM(lib, ruda_read);
  SYM(lib, ruda_future_wait);
  SYM(lib, ruda_future_free);
  SYM(lib, ruda_last_error);
  SYM(lib, ruda_error_message);
  if (!p_ruda_config_init || !p_ruda_device_open || !p_ruda_write || !p_ruda_read || !p_ruda_future_wait) {
    fprintf(stderr, "dlsym: %s\n", dlerror());
    return 1;
  }
  ruda_config cfg;
  p_ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  cfg.num_streams = 2;
  cfg.log_level = RUDA_LOG_ERROR;
  ruda_device *dev = NULL;
  if (p_ruda_device_open(&cfg, &dev) != 0) {
    fprintf(stderr, "open: %s\n", p_ruda_error_message(p_ruda_last_error()));
    return 1;
  }
  /* Larger than one write piece (8 MiB): staged in parallel through the
   * jemalloc arena (src/api.c, staging/copy.c). */
  const size_t n = (size_t)40 << 20;
  unsigned char *src = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 2654435761u >> 24);
  ruda_handle h;
  int rc = p_ruda_buffer_create(dev, 0, n, &h);
  ruda_copy_desc d = {0};
  if (rc == 0) {
    d = ruda_copy_contiguous(ruda_bind(h));
    rc = p_ruda_write(dev, 1, &d, src, n);
  }
  ruda_future *f = NULL;
  if (rc == 0) rc = p_ruda_read(dev, 0, &d, back, n, &f);
  if (rc == 0) rc = p_ruda_future_wait(f, NULL);
  if (f) p_ruda_future_free(f);
  if (rc != 0) {
    fprintf(stderr, "write/read: %s\n", p_ruda_error_message(p_ruda_last_error()));
    return 1;
  }
  if (memcmp(src, back, n) != 0) {
    fprintf(stderr, "the bytes read back differ from those written\n");
    return 1;
  }
  if (p_ruda_device_close(dev, NULL) != 0) return 1;
  free(src);
  free(back);
  printf("dlopen: libruda.so loaded late, 40 MiB staged and read back\n");
  return 0;
}
