/* version.c - the library's version, from the generated ruda/version.h
 * (CMake's project(VERSION), the one place it is written). */
#include "ruda/ruda.h"

const char *ruda_version(void) { return RUDA_VERSION_STRING; }

int ruda_version_number(void) { return RUDA_VERSION_NUMBER; }

const char *ruda_version_string(void) { return ruda_version(); }
