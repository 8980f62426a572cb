/* t_proto_fields — generate's and eval's fields for chat and constraints
 * (PROTOCOL.md): reasoning, keep_reasoning, template_vars, regex and choice
 * round trips, and the values the decoder refuses, each naming its field. */
#include "proto/proto.h"
#include "tests/check.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

/* Encodes q, decodes it into *o (the reader kept in *keep for o's strings). */
static int round_trip(const proto_req *q, proto_req *o, proto_reader **keep)
{
    proto_buf b = { 0 };
    char err[256] = "";
    proto_err code = PROTO_OK;
    *keep = proto_reader_new(0);
    int rc = proto_req_encode(&b, q) == 0 && proto_reader_feed(*keep, b.data, b.len) == 0
                 ? proto_reader_next_req(*keep, o, &code, err, sizeof err)
                 : -1;
    proto_buf_free(&b);
    CHECKF(rc == 1 && code == PROTO_OK, "rc %d %s: %s", rc, proto_err_name(code), err);
    return rc == 1 && code == PROTO_OK ? 0 : -1;
}

static void test_reasoning_fields(void)
{
    for (int t = 0; t < 2; t++)
        for (int m = PROTO_REASONING_SPLIT; m <= PROTO_REASONING_RAW; m++) {
            proto_req q, o;
            proto_reader *r;
            proto_req_init(&q, t ? PROTO_T_EVAL : PROTO_T_GENERATE, 3);
            q.text = "x"; q.text_len = 1;
            if (!t) q.reasoning = m;
            q.keep_reasoning = 1;
            if (round_trip(&q, &o, &r) == 0)
                CHECK(o.reasoning == (t ? PROTO_REASONING_AUTO : m) && o.keep_reasoning == 1);
            proto_reader_free(r);
        }
}

static void test_template_vars(void)
{
    static const char *const vars[] = { "{\"enable_thinking\":false}", "{}",
                                        "{\"a\":[1,2.5,\"\xc3\xa9\"],\"b\":{\"c\":null},\"d\":true}" };
    for (int t = 0; t < 2; t++)
        for (size_t v = 0; v < sizeof vars / sizeof *vars; v++) {
            proto_req q, o;
            proto_reader *r;
            proto_req_init(&q, t ? PROTO_T_EVAL : PROTO_T_GENERATE, 5);
            q.text = "x"; q.text_len = 1;
            q.template_vars = vars[v];
            q.template_vars_len = strlen(vars[v]);
            if (round_trip(&q, &o, &r) == 0)
                CHECKF(o.template_vars && o.template_vars_len == strlen(vars[v]) &&
                       !memcmp(o.template_vars, vars[v], o.template_vars_len),
                       "%s: %.*s", vars[v], (int)o.template_vars_len, o.template_vars ? o.template_vars : "");
            proto_reader_free(r);
        }
    /* absent: NULL */
    proto_req q, o;
    proto_reader *r;
    proto_req_init(&q, PROTO_T_GENERATE, 6);
    q.text = "x"; q.text_len = 1;
    if (round_trip(&q, &o, &r) == 0) CHECK(o.template_vars == NULL);
    proto_reader_free(r);
    /* not JSON object text: not encoded */
    proto_buf b = { 0 };
    q.template_vars = "{\"a\":";
    q.template_vars_len = 5;
    CHECK(proto_req_encode(&b, &q) != 0 && b.len == 0);
    proto_buf_free(&b);
}

/* {"type": "generate", "id": 1, "prompt": "x", key: <v>} */
static void refused_key(const char *key, void (*pack)(msgpack_packer *), proto_err want, const char *needle)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    msgpack_pack_str_with_body(&pk, "type", 4); msgpack_pack_str_with_body(&pk, "generate", 8);
    msgpack_pack_str_with_body(&pk, "id", 2); msgpack_pack_uint64(&pk, 1);
    msgpack_pack_str_with_body(&pk, "prompt", 6); msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_str_with_body(&pk, key, strlen(key));
    pack(&pk);
    proto_reader *r = proto_reader_new(0);
    proto_req q;
    proto_err code = PROTO_OK;
    char err[256] = "";
    int rc = proto_reader_feed(r, sb.data, sb.size) == 0 ? proto_reader_next_req(r, &q, &code, err, sizeof err) : -1;
    CHECKF(rc == 1 && code == want && strstr(err, needle), "rc %d %s: %s", rc, proto_err_name(code), err);
    CHECK_EQ_INT(q.id, 1);
    proto_reader_free(r);
    msgpack_sbuffer_destroy(&sb);
}

static void refused(void (*pack)(msgpack_packer *), proto_err want, const char *needle)
{
    refused_key("template_vars", pack, want, needle);
}

static void p_str(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "{}", 2); }
static void p_arr(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void p_intkey(msgpack_packer *pk) { msgpack_pack_map(pk, 1); msgpack_pack_int(pk, 1); msgpack_pack_int(pk, 2); }
static void p_own(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    msgpack_pack_str_with_body(pk, "enable_thinking", 15); msgpack_pack_false(pk);
    msgpack_pack_str_with_body(pk, "add_generation_prompt", 21); msgpack_pack_false(pk);
}

static void p_tools(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    msgpack_pack_str_with_body(pk, "tools", 5); msgpack_pack_array(pk, 0);
}

static void test_template_vars_refused(void)
{
    refused(p_str, PROTO_E_BAD_REQUEST, "\"template_vars\" must be a map");
    refused(p_arr, PROTO_E_BAD_REQUEST, "\"template_vars\" must be a map");
    refused(p_intkey, PROTO_E_BAD_REQUEST, "\"template_vars\" keys must be strings");
    refused(p_own, PROTO_E_INVALID_VALUE, "\"template_vars\".add_generation_prompt");
    refused(p_tools, PROTO_E_INVALID_VALUE, "\"template_vars\".tools: set by the request itself");
}

static void test_regex_choice(void)
{
    proto_req q, o;
    proto_reader *r;
    proto_req_init(&q, PROTO_T_GENERATE, 8);
    q.text = "x"; q.text_len = 1;
    q.regex = "[a-z]+\\d"; q.regex_len = strlen(q.regex);
    if (round_trip(&q, &o, &r) == 0)
        CHECK(o.regex && o.regex_len == q.regex_len && !memcmp(o.regex, q.regex, q.regex_len) && o.n_choice == 0);
    proto_reader_free(r);
    proto_req_init(&q, PROTO_T_GENERATE, 9);
    q.text = "x"; q.text_len = 1;
    q.choice[0] = "yes"; q.choice_len[0] = 3;
    q.choice[1] = "n\"o"; q.choice_len[1] = 3;
    q.n_choice = 2;
    if (round_trip(&q, &o, &r) == 0)
        CHECK(o.n_choice == 2 && o.choice_len[1] == 3 && !memcmp(o.choice[1], "n\"o", 3) && o.regex == NULL);
    proto_reader_free(r);
    proto_buf b = { 0 };
    q.n_choice = PROTO_MAX_CHOICE + 1;
    CHECK(proto_req_encode(&b, &q) != 0 && b.len == 0);
    proto_buf_free(&b);
}

static void p_choice_empty(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void p_choice_blank(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_str_with_body(pk, "a", 1);
    msgpack_pack_str_with_body(pk, "", 0);
}
static void p_choice_many(msgpack_packer *pk)
{
    msgpack_pack_array(pk, PROTO_MAX_CHOICE + 1);
    for (int i = 0; i <= PROTO_MAX_CHOICE; i++) msgpack_pack_str_with_body(pk, "a", 1);
}
static void p_choice_int(msgpack_packer *pk) { msgpack_pack_array(pk, 1); msgpack_pack_int(pk, 1); }
static void p_regex_empty(msgpack_packer *pk) { msgpack_pack_str_with_body(pk, "", 0); }

static void test_regex_choice_refused(void)
{
    refused_key("choice", p_choice_empty, PROTO_E_INVALID_VALUE, "\"choice\" is empty");
    refused_key("choice", p_choice_blank, PROTO_E_INVALID_VALUE, "\"choice\"[1] is empty");
    refused_key("choice", p_choice_many, PROTO_E_TOO_LARGE, "\"choice\" has 65 strings");
    refused_key("choice", p_choice_int, PROTO_E_BAD_REQUEST, "choice");
    refused_key("regex", p_regex_empty, PROTO_E_INVALID_VALUE, "\"regex\" is empty");
    refused_key("regex", p_choice_empty, PROTO_E_BAD_REQUEST, "regex");
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_reasoning_fields);
    RUN(test_template_vars);
    RUN(test_template_vars_refused);
    RUN(test_regex_choice);
    RUN(test_regex_choice_refused);
    return CHECK_DONE();
}
