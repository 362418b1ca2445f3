/* A program outside the ruda tree: built against an installed ruda to
 * check that the headers, libraries and CMake package are complete. */
#include <ruda/ruda.h>
#include <stdio.h>

int main(void) {
  ruda_config cfg;
  ruda_config_init(&cfg);
  cfg.backend = RUDA_BACKEND_HOST;
  ruda_device *dev;
  if (ruda_device_open(&cfg, &dev) != 0) return 1;
  ruda_handle h;
  int rc = ruda_buffer_create(dev, RUDA_STREAM_CURRENT, 64, &h);
  printf("ruda %s, backend %s, buffer %s\n", ruda_version(), ruda_device_backend(dev),
         rc == 0 ? "created" : ruda_err_name(rc));
  return rc != 0 || ruda_device_close(dev, NULL) != 0;
}
