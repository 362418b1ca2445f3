/* rendezvous_faults.c - getaddrinfo failing under the tcp rendezvous
 * (--wrap=getaddrinfo, tests/CMakeLists.txt): out of memory is
 * RUDA_ENOMEM, a resolver that cannot answer now RUDA_EIO, a name that
 * does not exist RUDA_EINVAL, each naming the address. */
#include <netdb.h>

#include "common.h"

static int fail_with; /* 0: the real getaddrinfo */

int __real_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res);
int __wrap_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
  if (fail_with != 0) return fail_with;
  return __real_getaddrinfo(node, service, hints, res);
}

static void resolver_failures_have_their_codes(void **state) {
  (void)state;
  static const struct {
    int eai, code;
  } cases[] = {{EAI_MEMORY, RUDA_ENOMEM}, {EAI_AGAIN, RUDA_EIO}, {EAI_FAIL, RUDA_EIO}, {EAI_NONAME, RUDA_EINVAL}};
  ruda_comm_id id;
  memset(&id, 0, sizeof id);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fail_with = cases[i].eai;
    for (uint32_t rank = 0; rank < 2; rank++) {
      assert_rc(ruda_comm_rendezvous("tcp:127.0.0.1:1", 2, rank, &id), cases[i].code);
      assert_last_error_contains("cannot resolve 127.0.0.1:1");
    }
  }
  fail_with = 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resolver_failures_have_their_codes),
  };
  return test_main("unit_rendezvous_faults", tests, sizeof tests / sizeof tests[0], argc, argv);
}
