/* t_proto_embed — the embed request and the embedding event (PROTOCOL.md):
 * encode/decode round trips, the vector's bytes on the wire (a bin of
 * little-endian float32, checked byte by byte against a hand-made one),
 * and requests the decoder refuses, each naming its field. */
#include "proto/proto.h"
#include "tests/check.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

static int decode_req(const void *data, size_t n, proto_req *q, proto_err *code, char *err, size_t errlen,
                      proto_reader **keep)
{
    proto_reader *r = proto_reader_new(0);
    if (proto_reader_feed(r, data, n) < 0) { proto_reader_free(r); return -2; }
    int rc = proto_reader_next_req(r, q, code, err, errlen);
    *keep = r;
    return rc;
}

static void test_request_roundtrip(void)
{
    proto_buf b = { 0 };
    proto_req q;
    proto_req_init(&q, PROTO_T_EMBED, 7);
    q.text = "hello";
    q.text_len = 5;
    q.special = 1;
    CHECK(proto_req_encode(&b, &q) == 0);
    proto_req d;
    proto_err code;
    char err[256];
    proto_reader *r;
    CHECK(decode_req(b.data, b.len, &d, &code, err, sizeof err, &r) == 1 && code == PROTO_OK);
    CHECK(d.type == PROTO_T_EMBED && d.id == 7 && d.text_len == 5 && !memcmp(d.text, "hello", 5) && d.special == 1);
    CHECK(strcmp(proto_type_name(PROTO_T_EMBED), "embed") == 0);
    proto_reader_free(r);
    proto_buf_free(&b);
    int32_t ids[3] = { 1, 2, 3 };
    proto_req_init(&q, PROTO_T_EMBED, 8);
    q.tokens = ids;
    q.n_tokens = 3;
    CHECK(proto_req_encode(&b, &q) == 0);
    CHECK(decode_req(b.data, b.len, &d, &code, err, sizeof err, &r) == 1 && code == PROTO_OK);
    CHECK(d.n_tokens == 3 && d.tokens && d.tokens[2] == 3 && d.text == NULL);
    proto_reader_free(r);
    proto_buf_free(&b);
}

/* A request map built by hand: {"type":"embed","id":1, extra...}. */
static void bad_req(void (*extra)(msgpack_packer *), int n_extra, proto_err want, const char *needle)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2 + (size_t)n_extra);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "embed", 5);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_int(&pk, 1);
    if (extra) extra(&pk);
    proto_req d;
    proto_err code;
    char err[256] = "";
    proto_reader *r;
    int rc = decode_req(sb.data, sb.size, &d, &code, err, sizeof err, &r);
    CHECKF(rc == 1 && code == want && strstr(err, needle), "want %s with \"%s\": got %s \"%s\"", proto_err_name(want),
           needle, proto_err_name(code), err);
    CHECK(d.id == 1 && d.type == PROTO_T_EMBED);
    proto_reader_free(r);
    msgpack_sbuffer_destroy(&sb);
}

static void x_both(msgpack_packer *pk)
{
    msgpack_pack_str_with_body(pk, "prompt", 6);
    msgpack_pack_str_with_body(pk, "a", 1);
    msgpack_pack_str_with_body(pk, "tokens", 6);
    msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 1);
}
static void x_empty(msgpack_packer *pk)
{
    msgpack_pack_str_with_body(pk, "tokens", 6);
    msgpack_pack_array(pk, 0);
}
static void x_neg(msgpack_packer *pk)
{
    msgpack_pack_str_with_body(pk, "tokens", 6);
    msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, -1);
}
static void x_utf8(msgpack_packer *pk)
{
    msgpack_pack_str_with_body(pk, "prompt", 6);
    msgpack_pack_str_with_body(pk, "a\xff", 2);
}
static void x_special(msgpack_packer *pk)
{
    msgpack_pack_str_with_body(pk, "prompt", 6);
    msgpack_pack_str_with_body(pk, "a", 1);
    msgpack_pack_str_with_body(pk, "special", 7);
    msgpack_pack_int(pk, 3);
}

static void test_bad_requests(void)
{
    bad_req(NULL, 0, PROTO_E_BAD_REQUEST, "\"prompt\"");
    bad_req(x_both, 2, PROTO_E_BAD_REQUEST, "one of \"prompt\" and \"tokens\"");
    bad_req(x_empty, 1, PROTO_E_INVALID_VALUE, "\"tokens\"");
    bad_req(x_neg, 1, PROTO_E_INVALID_VALUE, "\"tokens\"[1]");
    bad_req(x_utf8, 1, PROTO_E_INVALID_UTF8, "\"prompt\"");
    bad_req(x_special, 2, PROTO_E_BAD_REQUEST, "\"special\"");
}

static void test_embedding_event(void)
{
    float v[5] = { 1.0f, -2.5f, 0.0f, 3.0e-20f, -0.0f };
    proto_ev e;
    proto_ev_init(&e, PROTO_T_EMBEDDING, 42);
    e.embedding = v;
    e.n_embedding = 5;
    proto_buf b = { 0 };
    CHECK(proto_ev_encode(&b, &e) == 0);
    /* the wire form: "embedding" then bin8 of 20 bytes, little-endian float32 */
    const unsigned char want[4] = { 0x00, 0x00, 0x20, 0xc0 };   /* -2.5f */
    const char *key = "embedding";
    /* (its second occurrence: the first is the type's value) */
    char *at = b.data ? memmem(b.data, b.len, key, strlen(key)) : NULL;
    if (at) at = memmem(at + 1, b.len - (size_t)(at + 1 - b.data), key, strlen(key));
    CHECK(at != NULL);
    if (at) {
        const unsigned char *p = (const unsigned char *)at + strlen(key);
        CHECK(p[0] == 0xc4 && p[1] == 20);
        CHECK(memcmp(p + 2 + 4, want, 4) == 0);
    }
    proto_reader *r = proto_reader_new(0);
    CHECK(proto_reader_feed(r, b.data, b.len) == 0);
    proto_ev d;
    proto_err code;
    char err[256];
    CHECK(proto_reader_next_ev(r, &d, &code, err, sizeof err) == 1 && code == PROTO_OK);
    CHECK(d.type == PROTO_T_EMBEDDING && d.id == 42 && d.n_embedding == 5);
    CHECK(d.embedding && memcmp(d.embedding, v, sizeof v) == 0);
    proto_reader_free(r);
    proto_buf_free(&b);
    /* a bin whose size is no multiple of 4 is refused */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "embedding", 9);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "embedding", 9);
    msgpack_pack_bin_with_body(&pk, "abcde", 5);
    r = proto_reader_new(0);
    CHECK(proto_reader_feed(r, sb.data, sb.size) == 0);
    CHECK(proto_reader_next_ev(r, &d, &code, err, sizeof err) == 1 && code == PROTO_E_BAD_REQUEST &&
          strstr(err, "\"embedding\""));
    proto_reader_free(r);
    msgpack_sbuffer_destroy(&sb);
    /* info carries the pooling */
    proto_ev_init(&e, PROTO_T_INFO_OK, 3);
    e.pooling = "mean";
    e.pooling_source = "option";
    CHECK(proto_ev_encode(&b, &e) == 0);
    CHECK(b.data && memmem(b.data, b.len, "pooling_source", 14) && memmem(b.data, b.len, "option", 6));
    proto_buf_free(&b);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_request_roundtrip);
    RUN(test_bad_requests);
    RUN(test_embedding_event);
    return CHECK_DONE();
}
