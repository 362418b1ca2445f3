/* log.h - diagnostics on stderr, filtered by a threshold.
 *
 * Thread-safe (one fprintf per line); never blocks on anything but stderr.
 * The threshold is the caller's configured level (ruda_config.log_level):
 * layers and backends pass it in, so nothing here knows about a device.
 */
#ifndef RUDA_BASE_LOG_H
#define RUDA_BASE_LOG_H

#include "ruda/ruda.h"

/* Prints "ruda <level>: <message>" when level <= threshold. */
void ruda__log(ruda_log_level threshold, ruda_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* RUDA_BASE_LOG_H */
