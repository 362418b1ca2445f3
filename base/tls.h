/* tls.h - the TLS model of ruda's per-thread caches on the hot path.
 *
 * initial-exec reaches a variable %fs-relative, with no __tls_get_addr
 * call. But one such access marks the whole library STATIC_TLS: its entire
 * TLS segment, the private jemalloc's thread state (2.6 KiB) included,
 * must then fit in what glibc keeps of static TLS for libraries loaded
 * later, which it does not, so dlopen fails. A build for dlopen
 * (RUDA_TLS_DYNAMIC, set with RUDA_JEMALLOC_SOURCE in CMakeLists.txt)
 * keeps the default global-dynamic model, with TLS descriptors
 * (-mtls-dialect=gnu2): an access is then one indirect call that returns
 * the offset.
 */
#ifndef RUDA_BASE_TLS_H
#define RUDA_BASE_TLS_H

#ifdef RUDA_TLS_DYNAMIC
#define RUDA__TLS_HOT
#else
#define RUDA__TLS_HOT __attribute__((tls_model("initial-exec")))
#endif

#endif /* RUDA_BASE_TLS_H */
