/* ruda/export.h - symbol visibility. The library builds with hidden
 * visibility; only RUDA_EXTERN declarations are exported. */
#ifndef RUDA_EXPORT_H
#define RUDA_EXPORT_H

#if defined(RUDA_BUILDING_SHARED) && defined(__GNUC__)
#define RUDA_EXTERN __attribute__((visibility("default")))
#else
#define RUDA_EXTERN
#endif

#endif /* RUDA_EXPORT_H */
