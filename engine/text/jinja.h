/* jinja.h — a Jinja interpreter for chat templates (engine-internal).
 *
 * Renders the way Hugging Face transformers' apply_chat_template does: jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension ({% break %}, {% continue %}), {% generation %}
 * (renders its body), a tojson filter that keeps non-ASCII text, and the
 * globals raise_exception(msg) and strftime_now(fmt). Lists and dicts cannot
 * be changed in place (list.append is refused, as the sandbox refuses it);
 * namespace() objects can, through {% set ns.attr = ... %}.
 *
 * A parsed template is immutable: one may be rendered by several threads at
 * once. Every render is bounded (jinja_limits): a template that loops,
 * recurses, or writes or builds too much stops with a JINJA_ELIMIT error. */
#ifndef ANE_JINJA_H
#define ANE_JINJA_H

#include <stddef.h>
#include <stdint.h>

struct json_t;
typedef struct jinja_tpl jinja_tpl;

typedef struct jinja_limits {
    size_t max_output;     /* bytes of rendered text, and of any one captured block */
    size_t max_memory;     /* bytes of values alive at once */
    uint64_t max_steps;    /* loop iterations plus macro and function calls */
    uint64_t max_work;     /* bytes copied or scanned by string and list operations */
    int max_depth;         /* nesting of macro calls (Python's recursion limit, in effect) */
    size_t max_stack;      /* bytes of C stack the render may use */
} jinja_limits;

/* The defaults: 64 MiB of output, 256 MiB of values, 10 million steps,
 * 2 GiB of work, 200 nested calls, 2 MiB of stack. */
void jinja_default_limits(jinja_limits *lim);

/* Return codes of jinja_render (jinja_parse returns NULL on error). */
enum {
    JINJA_OK = 0,
    JINJA_ESYNTAX = 1,     /* the template does not parse */
    JINJA_ERAISE = 2,      /* the template called raise_exception(msg): err holds msg alone */
    JINJA_ERUNTIME = 3,    /* an error while rendering (undefined value, type, sandbox) */
    JINJA_ELIMIT = 4,      /* a bound was reached */
    JINJA_EINPUT = 5,      /* the variables are not a JSON object */
};

/* Parses a template (UTF-8). NULL with err set ("line N: ...") when it does
 * not parse. */
jinja_tpl *jinja_parse(const char *src, size_t len, char *err, size_t errlen);
void jinja_free(jinja_tpl *t);

/* Renders with the variables of a JSON object (messages, tools,
 * add_generation_prompt, bos_token, ...). now: the Unix time strftime_now
 * shows (as local time); lim NULL: the defaults. On success *out (malloc'd,
 * NUL-terminated) and *out_len; otherwise a JINJA_E* code, with err holding
 * "Kind: message (line N)" or, for JINJA_ERAISE, the template's message. */
int jinja_render(const jinja_tpl *t, const struct json_t *vars, int64_t now,
                 const jinja_limits *lim, char **out, size_t *out_len,
                 char *err, size_t errlen);

#endif
