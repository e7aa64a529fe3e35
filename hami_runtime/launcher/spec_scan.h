/* Does a bundle's spec ask for a GPU? The launcher's fast path (spec_scan.c). */
#ifndef HAMI_LAUNCHER_SPEC_SCAN_H
#define HAMI_LAUNCHER_SPEC_SCAN_H

#include <stddef.h>

/* 1 when <bundle>/config.json surely asks for nothing the runtime serves;
 * 0 when it asks, or when anything about it is in doubt. */
int spec_asks_nothing(const char *bundle);

/* The same for a spec already read (len bytes, not NUL-terminated). */
int spec_text_asks_nothing(const char *text, size_t len);

#endif
