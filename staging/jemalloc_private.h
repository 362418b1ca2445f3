/* jemalloc_private.h - jemalloc's API under the names ruda links it with.
 *
 * CMakeLists.txt renames the public symbols of Debian's libjemalloc_pic.a
 * to ruda_je_* so that jemalloc never replaces the application's malloc
 * (see there). Include this instead of <jemalloc/jemalloc.h>: the
 * non-standard entry points then resolve to the renamed copy. malloc and
 * free are deliberately not redirected: ruda's ordinary allocations stay
 * with the C library.
 */
#ifndef RUDA_JEMALLOC_PRIVATE_H
#define RUDA_JEMALLOC_PRIVATE_H

#define mallocx ruda_je_mallocx
#define dallocx ruda_je_dallocx
#define sdallocx ruda_je_sdallocx
#define rallocx ruda_je_rallocx
#define xallocx ruda_je_xallocx
#define sallocx ruda_je_sallocx
#define nallocx ruda_je_nallocx
#define mallctl ruda_je_mallctl
#define mallctlnametomib ruda_je_mallctlnametomib
#define mallctlbymib ruda_je_mallctlbymib
#define malloc_stats_print ruda_je_malloc_stats_print

#include <jemalloc/jemalloc.h>

#endif /* RUDA_JEMALLOC_PRIVATE_H */
