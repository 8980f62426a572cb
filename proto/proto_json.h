/* proto_json.h — MessagePack values <-> JSON text, for the request fields
 * that are passed on as JSON (tools, a message's tool_calls and other keys).
 * Internal to proto/. */
#ifndef ANE_PROTO_JSON_H
#define ANE_PROTO_JSON_H

#include <msgpack.h>
#include <stddef.h>

/* o as compact JSON text (malloc'd, NUL-terminated). skip: keys of a
 * top-level map to leave out (NULL-terminated list, or NULL). -1 with why
 * ("a key is not a string", "not valid UTF-8", "a float that is not
 * finite", "out of memory") and *bad_oom set when memory ran out. */
int pj_to_json(const msgpack_object *o, const char *const *skip, char **out, size_t *len,
               const char **why, int *bad_oom);

/* Packs JSON text (an object's members only when members_only: appended to
 * a map the caller opened with the extra count) as MessagePack. 0, or -1
 * when the text is not JSON. *n_members: the members packed (members_only). */
int pj_pack(msgpack_packer *p, const char *json, size_t len, int members_only, size_t *n_members);
/* How many members a JSON object text has; -1 when not an object. */
long pj_members(const char *json, size_t len);

#endif
