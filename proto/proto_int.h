/* proto_int.h — what proto.c and proto_read.c share; not installed. */
#ifndef ANE_PROTO_INT_H
#define ANE_PROTO_INT_H

#include "proto/proto.h"

#include <stddef.h>

/* Wire name -> type, among requests (events = 0) or events (events = 1);
 * PROTO_T_NONE when unknown. */
proto_type proto_type_lookup(const char *s, size_t n, int events);

#endif
