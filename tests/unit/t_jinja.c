/* t_jinja.c — the Jinja interpreter (engine/text/jinja.h): the language,
 * case by case against jinja2's own output (configured as transformers
 * configures it); the errors jinja2 raises, with its messages; templates that
 * do not parse; the bounds that stop a hostile template (a huge loop, deep or
 * exploding recursion, output or memory growth, deep values, C stack); and
 * every rendered case of tests/fixtures/chat (68 real templates): each text
 * byte for byte, and a raise wherever jinja2 raises. */
#include "tests/check.h"
#include "engine/text/jinja.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t fixed_now;   /* 2026-11-26 12:00 local time, as the references fix it */

/* (template, expected) pairs: the expected texts are jinja2 3.1.6's, configured as transformers configures it */
static const char *const render_cases[][2] = {
    /* Whitespace control and the lexer */
    { "a {{- \" b \" -}} c\n  {%- if true %}x{% endif %}\n{% if true %}\n  yes\n{% endif %}\n    {% if true %}indented tag alone{% endif %}\n{% for x in [1, 2] %}\n{{ x }}\n{% endfor %}\nline {% if true %}keeps{% endif %} inline\na {%+ if true %}b{% endif +%}\nc\n{# a comment #}\nafter\n  {# indented comment #}\nx\n{% raw %}{{ not }} {% evaluated %}{% endraw %}\ntrailing newline dropped once\n\nCR LF line endings are normalised\n",
      "a b cx  yes\nindented tag alone1\n2\nline keeps inline\na b\nc\nafter\nx\n{{ not }} {% evaluated %}trailing newline dropped once\n\nCR LF line endings are normalised" },
    { "a\r\nb\rc\r\n\r\n",
      "a\nb\nc\n" },
    /* Expressions */
    { "{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }}",
      "5.0 3 -4 1 2 64 4" },
    { "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1 / 3 }} {{ 10 / 2 }} {{ 1.0e-5 }} {{ -0.0 }} {{ 3.0 }}",
      "0.30000000000000004 1e+16 1000000000000000.0 0.3333333333333333 5.0 1e-05 -0.0 3.0" },
    { "{{ \"a\" ~ 1 ~ none ~ true ~ [1] }} {{ \"ab\" * 2 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ (1,) + (2,) }}",
      "a1NoneTrue[1] abab [1, 1] [1, 2] (1, 2)" },
    { "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ \"a\" < \"b\" }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }}",
      "True False True True True True" },
    { "{{ \"b\" in \"abc\" }} {{ 1 in [1, 2] }} {{ \"k\" in d }} {{ \"v\" in d }} {{ 3 not in lst }}",
      "True True True False False" },
    { "{{ not 1 }} {{ 0 or \"x\" }} {{ 1 and \"y\" }} {{ none or none }} {{ \"\" or [] }}",
      "False x y None []" },
    { "{{ \"yes\" if i > 3 else \"no\" }} {{ \"yes\" if i > 9 }}|",
      "yes |" },
    { "{{ [1, \"a\", none, true, 1.5, {\"x\": (1,)}] }} {{ (1, 2) }} {{ () }} {{ {} }} {{ [\"it's\", 'say \"hi\"', \"both ' \\\"\"] }}",
      "[1, 'a', None, True, 1.5, {'x': (1,)}] (1, 2) () {} [\"it's\", 'say \"hi\"', 'both \\' \"']" },
    { "{{ s[1:3] }} {{ s[-1] }} {{ s[::-1] }} {{ lst[1:] }} {{ lst[::2] }} {{ lst[-1] }} {{ s|length }} {{ \"x\".0 }}",
      "\303\251l d dlr\303\266w oll\303\251h [1, 2] [3, 2] 2 11 x" },
    { "{{ \"%s-%d-%05.1f-%x-%r\" % (\"a\", 3, 2.25, 255, \"q\") }} {{ \"%(a)s\" % {\"a\": 1} }} {{ \"{} {:>4} {name}\".format(1, \"b\", name=\"c\") }}",
      "a-3-002.2-ff-'q' 1 1    b c" },
    { "{{ 1_000 }} {{ 0x1f }} {{ 0b101 }} {{ 1.5e2 }} {{ \"a\" \"b\" }} {{ '\\n\\t\\x41\\u00e9' }}",
      "1000 31 5 150.0 ab \n\tA\303\251" },
    /* Lookups and undefined */
    { "{{ d.k }} {{ d[\"k\"] }} {{ d[\"items\"] }} {{ d.missing }}| {{ msgs[0].role }} {{ msgs.0.role }} {{ msgs[5] }}|",
      "v v 3 | user user |" },
    { "{{ x }}|{{ x is defined }} {{ n is none }} {{ d.n is none }} {{ x|default(\"dflt\") }} {{ e|default(\"dflt\", true) }} {{ d.missing|d(\"m\") }}",
      "|False True True dflt dflt m" },
    { "{{ x|length }} {{ x|list }} {{ x|string }}| {{ x ~ \"!\" }}",
      "0 [] | !" },
    { "{{ d.get(\"k\") }} {{ d.get(\"zz\") }} {{ d.get(\"zz\", 7) }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}",
      "v None 7 ['k', 'items', 'n'] ['v', 3, None] [('k', 'v'), ('items', 3), ('n', None)]" },
    /* Statements and scoping */
    { "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}",
      "110;120;1" },
    { "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
      "5" },
    { "{% set ns = namespace(total=0, names=[]) %}{% for m in msgs %}{% set ns.total = ns.total + 1 %}{% set ns.names = ns.names + [m.role] %}{% endfor %}{{ ns.total }} {{ ns.names }}",
      "2 ['user', 'assistant']" },
    { "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }} {% endfor %}",
      "1/0/2/1/2/True/False 2/1/1/0/2/False/True " },
    { "{% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined else \"-\" }}>{{ loop.nextitem.role if loop.nextitem is defined else \"-\" }} {% endfor %}",
      "->assistant user>- " },
    { "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }}{{ loop.cycle(\"a\", \"b\") }} {% endfor %}",
      "21a 42b " },
    { "{% for x in [] %}never{% else %}empty{% endfor %} {% for x in undefined_name %}never{% else %}undefined iterates as empty{% endfor %}",
      "empty undefined iterates as empty" },
    { "{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      "13" },
    { "{% for k, v in d|dictsort %}{{ k }}={{ v }};{% endfor %} {% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
      "items=3;k=v;n=None; 37" },
    { "{% set a, b = \"xy\" %}{{ b }}{{ a }} {% set blk %}  block {{ 1 }}  {% endset %}[{{ blk }}] {% set up | upper %}up{% endset %}{{ up }}",
      "yx [  block 1  ] UP" },
    { "{% macro greet(name, greeting=\"Hello\") %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet(\"Ann\") }} {{ greet(\"Bob\", greeting=\"Hi\") }} {{ greet() }}",
      "Hello, Ann! Hi, Bob! Hello, !" },
    { "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
      "1(2, 3){'k': 4}" },
    { "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap(\"b\") %}inner {{ 1 + 1 }}{% endcall %}",
      "<b>inner 2</b>" },
    { "{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1)|int }}{% endmacro %}{{ fact(6) }}",
      "720" },
    { "{% filter upper %}filtered {{ \"text\" }}{% endfilter %} {% with q = 3 %}{{ q }}{% endwith %}{{ q }}|",
      "FILTERED TEXT 3|" },
    { "{% for x in [[1, [2]], [3]] recursive %}{% if x is iterable %}[{{ loop(x) }}]{% else %}{{ x }}{{ loop.depth }}{% endif %}{% endfor %}",
      "[12[23]][32]" },
    { "{% generation %}generated {{ 1 }}{% endgeneration %}",
      "generated 1" },
    { "{% set x = 1 %}{% for i in [1, 2] %}{% if i == 2 %}{% set x = 5 %}{% endif %}{{ x }}{% endfor %}{{ x }} {% set x = 1 %}{% macro mx() %}{{ x }}{% endmacro %}{% for x in [5] %}{{ mx() }}{% endfor %}",
      "151 1" },
    { "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ loop.depth }}{% endfor %}{{ loop.index }}{% endfor %} {% for x in [1, 2, 2, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}",
      "1121111212 123" },
    /* Filters */
    { "{{ \"  pad  \"|trim }}|{{ \"xxaxx\"|trim(\"x\") }}|{{ \"hello world-foo\"|title }}|{{ \"hELLO\"|capitalize }}|{{ s|upper }}|{{ \"\303\200B\"|lower }}",
      "pad|a|Hello World-Foo|Hello|H\303\211LLO W\303\226RLD|\303\240b" },
    { "{{ [1, 2]|join(\",\") }} {{ msgs|join(\"|\", attribute=\"role\") }} {{ msgs|map(attribute=\"role\")|list }} {{ [\"a\", \"b\"]|map(\"upper\")|join }}",
      "1,2 user|assistant ['user', 'assistant'] AB" },
    { "{{ msgs|selectattr(\"role\", \"equalto\", \"user\")|list|length }} {{ msgs|rejectattr(\"role\", \"eq\", \"user\")|map(attribute=\"content\")|first }} {{ [0, 1, \"\", \"a\"]|select|list }} {{ [1, 2, 3]|reject(\"odd\")|list }}",
      "1 Yo [1, 'a'] [2]" },
    { "{{ lst|sort }} {{ lst|sort(reverse=true) }} {{ [\"b\", \"A\", \"c\"]|sort }} {{ [\"b\", \"A\", \"c\"]|sort(case_sensitive=true) }} {{ msgs|sort(attribute=\"role\")|map(attribute=\"role\")|join(\",\") }}",
      "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'] assistant,user" },
    { "{{ [1, 2, 1, \"a\", \"A\"]|unique|list }} {{ lst|min }} {{ lst|max }} {{ lst|sum }} {{ lst|first }} {{ lst|last }} {{ lst|reverse|list }} {{ \"abc\"|reverse }}",
      "[1, 2, 'a'] 1 3 6 3 2 [2, 1, 3] cba" },
    { "{{ d|dictsort }} {{ d|dictsort(reverse=true)|first }} {{ d|items|list }} {{ d|length }} {{ \"abc\"|list }} {{ lst|batch(2)|list }}",
      "[('items', 3), ('k', 'v'), ('n', None)] ('n', None) [('k', 'v'), ('items', 3), ('n', None)] 3 ['a', 'b', 'c'] [[3, 1], [2]]" },
    { "{{ \"a\\nb\\n\\nc\"|indent }}|{{ \"a\\nb\"|indent(2, true) }}|{{ \"a\\n\\nb\"|indent(width=\">\", blank=true) }}",
      "a\n    b\n\n    c|  a\n  b|a\n>\n>b" },
    { "{{ 3.7|int }} {{ \"42\"|int }} {{ \"x\"|int }} {{ \"4.9\"|int }} {{ \"0x1A\"|int(base=16) }} {{ \"3.5\"|float }} {{ \"no\"|float(1.5) }} {{ 5|float }}",
      "3 42 0 4 26 3.5 1.5 5.0" },
    { "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, \"ceil\") }} {{ -3|abs }} {{ 5|round }}",
      "2.0 4.0 2.67 3.0 3 5" },
    { "{{ \"Hello World\"|replace(\"o\", \"0\") }} {{ \"aaa\"|replace(\"a\", \"b\", 2) }} {{ \"a b  c\"|wordcount }} {{ \"long text here\"|truncate(9, leeway=0) }} {{ 5|string ~ \"x\" }}",
      "Hell0 W0rld bba 3 long... 5x" },
    { "{{ \"x\"|center(5) }}| {{ \"%s=%s\"|format(\"a\", 1) }} {{ \"<a href='x'>&</a>\"|e }} {{ (\"<b>\"|safe) + \"<i>\" }} {{ (\"x\"|safe) ~ \"<y>\" }}",
      "  x  | a=1 &lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt; <b>&lt;i&gt; x<y>" },
    { "{{ {\"b\": 1, \"a\": [1, 2, {\"c\": none}]}|tojson }} {{ s|tojson }} {{ \"\\u2028<&>\\n\"|tojson }} {{ {\"a\": {\"b\": []}}|tojson(indent=2) }}",
      "{\"b\": 1, \"a\": [1, 2, {\"c\": null}]} \"h\303\251llo w\303\266rld\" \"\342\200\250<&>\\n\" {\n  \"a\": {\n    \"b\": []\n  }\n}" },
    { "{{ d|tojson(sort_keys=true) }} {{ [1, 2]|tojson(separators=(\",\", \":\")) }} {{ s|tojson(ensure_ascii=true) }} {{ (1, none, false, 1.0)|tojson }}",
      "{\"items\": 3, \"k\": \"v\", \"n\": null} [1,2] \"h\\u00e9llo w\\u00f6rld\" [1, null, false, 1.0]" },
    /* Tests */
    { "{{ \"a\" is string }} {{ 1 is number }} {{ true is number }} {{ true is boolean }} {{ 1 is integer }} {{ 1.0 is float }} {{ d is mapping }} {{ msgs is sequence }} {{ \"s\" is iterable }} {{ 1 is iterable }}",
      "True True True True True True True True True False" },
    { "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 2 is in [1, 2] }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ \"abc\" is lower }} {{ x is undefined }} {{ none is none }} {{ false is false }}",
      "True True True True True True True True True True" },
    { "{{ \"upper\" is filter }} {{ \"nofilter\" is filter }} {{ \"odd\" is test }} {{ msgs[0] is mapping and msgs[0].role == \"user\" }}",
      "True False True True" },
    /* String methods */
    { "{{ \" a  b \".split() }} {{ \"a,b,,c\".split(\",\") }} {{ \"a,b,c\".split(\",\", 1) }} {{ \"a,b,c\".rsplit(\",\", 1) }} {{ \"l1\\nl2\\r\\nl3\".splitlines() }}",
      "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'] ['l1', 'l2', 'l3']" },
    { "{{ \"  x \".strip() }}|{{ \"  x \".lstrip() }}|{{ \"  x \".rstrip() }}|{{ \"xyx\".strip(\"x\") }}|{{ \"--a--\".lstrip(\"-\") }}",
      "x|x |  x|y|a--" },
    { "{{ \"abc\".startswith(\"a\") }} {{ \"abc\".endswith((\"x\", \"c\")) }} {{ \"abcabc\".find(\"c\") }} {{ \"abcabc\".rfind(\"c\") }} {{ \"abcabc\".count(\"b\") }} {{ \"h\303\251llo\".find(\"l\") }}",
      "True True 2 5 2 2" },
    { "{{ \"Hello\".upper() }} {{ \"Hello\".lower() }} {{ \"hello world\".title() }} {{ \"hello\".capitalize() }} {{ \"Hello\".swapcase() }} {{ \"a-b\".replace(\"-\", \"+\") }}",
      "HELLO hello Hello World Hello hELLO a+b" },
    { "{{ \",\".join([\"a\", \"b\"]) }} {{ \"ab\".center(6, \"*\") }} {{ \"7\".zfill(3) }} {{ \"ab\".ljust(4) }}| {{ \"a=b=c\".partition(\"=\") }} {{ \"x.y.z\".rpartition(\".\") }}",
      "a,b **ab** 007 ab  | ('a', '=', 'b=c') ('x.y', '.', 'z')" },
    { "{{ \"abc\".isalpha() }} {{ \"123\".isdigit() }} {{ \"   \".isspace() }} {{ \"Ab\".isupper() }} {{ \"prefix-x\".removeprefix(\"prefix-\") }}",
      "True True True False x" },
    /* Unicode and Markup */
    { "{% for s in [\"stra\303\237e\", \"\316\243\316\221\316\243 \316\237\316\224\316\237\316\243\", \"\304\260stanbul\", \"\357\254\201nal\", \"\307\205emal\", \"\316\206\316\243.\", \"a\316\243'\"] %}{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ s.swapcase() }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }};{% endfor %}",
      "STRASSE|stra\303\237e|Stra\303\237e|Stra\303\237e|STRASSE|STRASSE|stra\303\237e|Stra\303\237e;\316\243\316\221\316\243 \316\237\316\224\316\237\316\243|\317\203\316\261\317\202 \316\277\316\264\316\277\317\202|\316\243\316\261\317\202 \316\237\316\264\316\277\317\202|\316\243\316\261\317\202 \316\277\316\264\316\277\317\202|\317\203\316\261\317\202 \316\277\316\264\316\277\317\202|\316\243\316\221\316\243 \316\237\316\224\316\237\316\243|\317\203\316\261\317\202 \316\277\316\264\316\277\317\202|\316\243\316\261\317\202 \316\237\316\264\316\277\317\202;\304\260STANBUL|i\314\207stanbul|\304\260stanbul|\304\260stanbul|i\314\207STANBUL|\304\260STANBUL|i\314\207stanbul|\304\260stanbul;FINAL|\357\254\201nal|Final|Final|FINAL|FINAL|\357\254\201nal|FInal;\307\204EMAL|\307\206emal|\307\205emal|\307\205emal|\307\205EMAL|\307\204EMAL|\307\206emal|\307\204emal;\316\206\316\243.|\316\254\317\202.|\316\206\317\202.|\316\206\317\202.|\316\254\317\202.|\316\206\316\243.|\316\254\317\202.|\316\206\317\203.;A\316\243'|a\317\202'|A\317\202'|A\317\202'|A\317\202'|A\316\243'|a\317\202'|A\317\203';" },
    { "{{ \"  a\\u3000b\\u00a0c \".split() }} {{ \"\\u3000x\\u3000\".strip() }} {{ \"a\\u2028b\\x1cc\".splitlines() }} {{ \"h\303\251llo_w\303\266rld 42 \346\227\245\346\234\254 a-b\"|wordcount }} {{ [\"\303\251\", \"\\u200b\", \"\\U0001F600\", \"\\x7f\"] }}",
      "['a', 'b', 'c'] x ['a', 'b', 'c'] 5 ['\303\251', '\\u200b', '\360\237\230\200', '\\x7f']" },
    { "{{ \"{:,}|{:_}|{:,.2f}|{:_x}\".format(1234567, 1234567, 1234567.891, 1048575) }} {{ \"%-6s|%6s|%.2s|%c\" % (\"\303\251\", \"\303\274\", \"\346\227\245\346\234\254\350\252\236\", 233) }}",
      "1,234,567|1_234_567|1,234,567.89|f_ffff \303\251     |     \303\274|\346\227\245\346\234\254|\303\251" },
    { "{{ {\"a\": 1}|attr(\"a\") }}|{{ {\"a\": 1}|attr(\"get\") is defined }} {{ \"<b>\"|safe ~ \"<i>\" }} {{ (\"<b>\"|safe).upper() + \"&\" }} {{ (\"%s\"|safe) % \"<x>\" }} {{ \"<>\"|escape|escape }}",
      "|True <b><i> <B>&amp; &lt;x&gt; &lt;&gt;" },
    /* Globals */
    { "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b=2) }} {{ namespace(a=1).a }}",
      "[0, 1, 2] [1, 4, 7] [5, 3, 1] {'a': 1, 'b': 2} 1" },
    { "{{ strftime_now(\"%Y-%m-%d %H:%M %A %B %d %b\") }}",
      "2026-11-26 12:00 Thursday November 26 Nov" },
    { "{% set j = joiner(\", \") %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}",
      "1, 2, 3" },
};

/* templates that raise when rendered, and the message jinja2 gives (a part of it) */
static const char *const error_cases[][2] = {
    { "{{ raise_exception(\"Only user and assistant roles are supported!\") }}", "Only user and assistant roles are supported!" }, /* TemplateError */
    { "{{ x.y }}", "'x' is undefined" }, /* UndefinedError */
    { "{{ d.missing.deeper }}", "'dict object' has no attribute 'missing'" }, /* UndefinedError */
    { "{{ msgs.append(1) }}", "access to attribute 'append' of 'list' object is unsafe." }, /* SecurityError */
    { "{{ d.pop(\"k\") }}", "access to attribute 'pop' of 'dict' object is unsafe." }, /* SecurityError */
    { "{{ \"a\" + 1 }}", "can only concatenate str (not \"int\") to str" }, /* TypeError */
    { "{{ \"a\" + d }}", "can only concatenate str (not \"dict\") to str" }, /* TypeError */
    { "{{ 1 / 0 }}", "division by zero" }, /* ZeroDivisionError */
    { "{{ 1 < \"a\" }}", "'<' not supported between instances of 'int' and 'str'" }, /* TypeError */
    { "{{ x|tojson }}", "Object of type Undefined is not JSON serializable" }, /* TypeError */
    { "{{ msgs|map(attribute=\"role\")|tojson }}", "Object of type generator is not JSON serializable" }, /* TypeError */
    { "{{ msgs|selectattr(\"role\")|length }}", "object of type 'generator' has no len()" }, /* TypeError */
    { "{% for x in none %}{% endfor %}", "'NoneType' object is not iterable" }, /* TypeError */
    { "{% for x in 5 %}{% endfor %}", "'int' object is not iterable" }, /* TypeError */
    { "{{ \"%d\" % \"x\" }}", "%d format: a real number is required, not str" }, /* TypeError */
    { "{{ \"%s %s\" % (\"a\",) }}", "not enough arguments for format string" }, /* TypeError */
    { "{% set a, b = [1, 2, 3] %}", "too many values to unpack (expected 2)" }, /* ValueError */
    { "{% set xx = 5 %}{% set xx.y = 1 %}", "cannot assign attribute on non-namespace object" }, /* TemplateRuntimeError */
    { "{{ range(1000000)|length }}", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)." }, /* OverflowError */
    { "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", "macro 'f' takes not more than 1 argument(s)" }, /* TypeError */
    { "{% macro f(a) %}{% endmacro %}{{ f(b=1) }}", "macro 'f' takes no keyword argument 'b'" }, /* TypeError */
    { "{{ (1 if false).x }}", "the inline if-expression on line 1 evaluated to false and no else section was defined." }, /* UndefinedError */
    { "{{ lst[0:1:0] }}", "slice step cannot be zero" }, /* ValueError */
    { "{{ 1|nofilter }}", "No filter named 'nofilter'." }, /* TemplateAssertionError */
    { "{{ \"abc\".nosuch() }}", "'str object' has no attribute 'nosuch'" }, /* UndefinedError */
    { "{{ d() }}", "'dict' object is not callable" }, /* TypeError */
    { "{{ \"x\" in none }}", "argument of type 'NoneType' is not iterable" }, /* TypeError */
    { "{{ [1, 2].index(5) }}", "5 is not in list" }, /* ValueError */
    { "{% if false %}{{ 1|nofilter }}{% else %}{{ 1|nofilter }}{% endif %}", "No filter named 'nofilter' found." }, /* TemplateRuntimeError */
};

/* templates that do not parse */
static const char *const syntax_cases[] = {
    "{% if true %}unclosed", /* TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following tags: 'elif' or  */
    "{% for x in %}{% endfor %}", /* TemplateSyntaxError: Expected an expression, got 'end of statement block' */
    "{{ 1 + }}", /* TemplateSyntaxError: unexpected 'end of print statement' */
    "{% frobnicate %}", /* TemplateSyntaxError: Encountered unknown tag 'frobnicate'. */
    "{{ x|nofilter }}", /* TemplateAssertionError: No filter named 'nofilter'. */
    "{% break %}", /* SyntaxError: 'break' outside loop (<template>, line 11) */
    "{% macro m() %}{% break %}{% endmacro %}", /* SyntaxError: 'break' outside loop (<template>, line 15) */
    "{{ \"unterminated }}", /* TemplateSyntaxError: unexpected char '"' at 3 */
    "{{ (1 }}", /* TemplateSyntaxError: unexpected '}', expected ')' */
    "{% endif %}", /* TemplateSyntaxError: Encountered unknown tag 'endif'. */
    "{{ 1 ]] }}", /* TemplateSyntaxError: unexpected ']' */
};
static const char vars_json[] = "{\"msgs\": [{\"role\": \"user\", \"content\": \"Hi <b>\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}], \"d\": {\"k\": \"v\", \"items\": 3, \"n\": null}, \"s\": \"h\\u00e9llo w\\u00f6rld\", \"n\": null, \"i\": 5, \"f\": 2.5, \"lst\": [3, 1, 2], \"e\": \"\"}";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Parses and renders; returns the jinja_render code (JINJA_ESYNTAX when the
 * template does not parse), *out malloc'd on success. */
static int render(const char *src, size_t len, const json_t *vars, const jinja_limits *lim, char **out, size_t *out_len,
                  char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    jinja_tpl *t = jinja_parse(src, len, err, errlen);
    if (!t) return JINJA_ESYNTAX;
    int rc = jinja_render(t, vars, fixed_now, lim, out, out_len, err, errlen);
    jinja_free(t);
    return rc;
}

static void test_constructs(void)
{
    json_error_t je;
    json_t *vars = json_loads(vars_json, 0, &je);
    CHECK(vars != NULL);
    for (size_t i = 0; i < sizeof render_cases / sizeof *render_cases; i++) {
        char *out, err[1024];
        size_t n;
        int rc = render(render_cases[i][0], strlen(render_cases[i][0]), vars, NULL, &out, &n, err, sizeof err);
        CHECKF(rc == JINJA_OK, "%s: %s", render_cases[i][0], err);
        if (rc == JINJA_OK)
            CHECKF(n == strlen(render_cases[i][1]) && memcmp(out, render_cases[i][1], n) == 0,
                   "%s\n  want %s\n  got  %s", render_cases[i][0], render_cases[i][1], out);
        free(out);
    }
    json_decref(vars);
}

static void test_errors(void)
{
    json_error_t je;
    json_t *vars = json_loads(vars_json, 0, &je);
    for (size_t i = 0; i < sizeof error_cases / sizeof *error_cases; i++) {
        char *out, err[1024] = "";
        size_t n;
        int rc = render(error_cases[i][0], strlen(error_cases[i][0]), vars, NULL, &out, &n, err, sizeof err);
        CHECKF(rc != JINJA_OK && strstr(err, error_cases[i][1]), "%s: rc %d, err '%s', want '%s'",
               error_cases[i][0], rc, err, error_cases[i][1]);
        CHECK(out == NULL);
    }
    /* raise_exception: its own code, and its message alone */
    char *out, err[256];
    size_t n;
    const char *src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user turn.') }}{% endif %}ok";
    json_t *v = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "system", "content", "x");
    CHECK_EQ_INT(render(src, strlen(src), v, NULL, &out, &n, err, sizeof err), JINJA_ERAISE);
    CHECK(strcmp(err, "Conversation must start with a user turn.") == 0);
    json_decref(v);
    v = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "x");
    CHECK_EQ_INT(render(src, strlen(src), v, NULL, &out, &n, err, sizeof err), JINJA_OK);
    CHECK(out && strcmp(out, "ok") == 0);
    free(out);
    json_decref(v);
    /* other errors name their kind and line */
    src = "line one\n{{ undefined_thing.attr }}";
    CHECK_EQ_INT(render(src, strlen(src), NULL, NULL, &out, &n, err, sizeof err), JINJA_ERUNTIME);
    CHECKF(strcmp(err, "UndefinedError: 'undefined_thing' is undefined (line 2)") == 0, "%s", err);
    json_decref(vars);
}

static void test_syntax(void)
{
    for (size_t i = 0; i < sizeof syntax_cases / sizeof *syntax_cases; i++) {
        char err[512] = "";
        jinja_tpl *t = jinja_parse(syntax_cases[i], strlen(syntax_cases[i]), err, sizeof err);
        CHECKF(t == NULL && strncmp(err, "line ", 5) == 0, "%s: parsed (%s)", syntax_cases[i], err);
        jinja_free(t);
    }
    char err[256];
    CHECK(jinja_parse("\xff\xfe{{ x }}", 9, err, sizeof err) == NULL && strstr(err, "UTF-8"));
    CHECK(jinja_parse("a\0b", 3, err, sizeof err) == NULL && strstr(err, "NUL"));
}

static void test_api(void)
{
    char *out, err[256];
    size_t n;
    /* no variables at all */
    CHECK_EQ_INT(render("[{{ messages }}]", 16, NULL, NULL, &out, &n, err, sizeof err), JINJA_OK);
    CHECK(out && strcmp(out, "[]") == 0);
    free(out);
    /* the variables must be an object */
    json_t *arr = json_array();
    jinja_tpl *t = jinja_parse("x", 1, err, sizeof err);
    CHECK_EQ_INT(jinja_render(t, arr, 0, NULL, &out, &n, err, sizeof err), JINJA_EINPUT);
    CHECK(out == NULL);
    json_decref(arr);
    jinja_free(t);
    /* strftime_now shows `now` as local time */
    CHECK_EQ_INT(render("{{ strftime_now('%d %B %Y') }}", 30, NULL, NULL, &out, &n, err, sizeof err), JINJA_OK);
    CHECK(out && strcmp(out, "26 November 2026") == 0);
    free(out);
    /* one parsed template, rendered twice, gives the same text */
    const char *src = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}";
    t = jinja_parse(src, strlen(src), err, sizeof err);
    json_t *v = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "messages", "role", "user", "content", " a ", "role",
                          "assistant", "content", "b\n");
    char *o1, *o2;
    size_t n1, n2;
    CHECK_EQ_INT(jinja_render(t, v, 0, NULL, &o1, &n1, err, sizeof err), JINJA_OK);
    CHECK_EQ_INT(jinja_render(t, v, 0, NULL, &o2, &n2, err, sizeof err), JINJA_OK);
    CHECK(o1 && o2 && n1 == n2 && strcmp(o1, "<user>a<assistant>b") == 0 && strcmp(o1, o2) == 0);
    free(o1);
    free(o2);
    json_decref(v);
    jinja_free(t);
}

/* ---- bounds ---- */

static int bounded(const char *src, const jinja_limits *lim, int want_rc, const char *want_msg, double max_s)
{
    char *out, err[512] = "";
    size_t n;
    double t0 = now_s();
    int rc = render(src, strlen(src), NULL, lim, &out, &n, err, sizeof err);
    double dt = now_s() - t0;
    free(out);
    CHECKF(rc == want_rc && strstr(err, want_msg), "%s: rc %d, '%s'", src, rc, err);
    CHECKF(dt < max_s, "%s: took %.1f s", src, dt);
    fprintf(stderr, "  %-70.70s %.2f s: %s\n", src, dt, err);
    return rc == want_rc;
}

static void test_bounds(void)
{
    jinja_limits lim;
    jinja_default_limits(&lim);
    /* a loop over range(10**9): the sandbox's MAX_RANGE */
    bounded("{% for i in range(10**9) %}{{ i }}{% endfor %}", NULL, JINJA_ERUNTIME, "MAX_RANGE (100000)", 1);
    /* loops within loops: the step bound (the default, 10 million) */
    bounded("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, JINJA_ELIMIT,
            "more than 10000000 loop iterations", 30);
    /* a macro that recurses without end: the call depth */
    bounded("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, JINJA_ELIMIT, "nested more than 200 deep", 5);
    /* a macro that calls itself twice, 40 deep (2^40 calls): the step bound */
    lim.max_steps = 1000000;
    bounded("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", &lim,
            JINJA_ELIMIT, "more than 1000000 loop iterations and calls", 30);
    /* output growing past the limit */
    bounded("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", NULL, JINJA_ELIMIT,
            "wrote more than 67108864 bytes", 30);
    /* a value doubling in a loop: the memory bound */
    jinja_default_limits(&lim);
    lim.max_output = SIZE_MAX;
    bounded("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", &lim,
            JINJA_ELIMIT, "more than 268435456 bytes of memory", 30);
    bounded("{{ 'x' * 10**12 }}", NULL, JINJA_ELIMIT, "bytes of memory", 1);
    /* a value nested 5000 deep: printing it stops; building and freeing it works */
    bounded("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
            NULL, JINJA_ELIMIT, "value nested more than", 5);
    bounded("{% set ns = namespace(v=[]) %}{% for i in range(50000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v|length }}",
            NULL, JINJA_OK, "", 5);
    /* a namespace holding itself: a cycle, freed with the render */
    bounded("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me.me is defined }}", NULL, JINJA_OK, "", 1);
    /* string work: scanning a megabyte 100,000 times */
    jinja_default_limits(&lim);
    lim.max_work = 1ULL << 30;
    bounded("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'yz' in s %}{% endif %}{% endfor %}", &lim,
            JINJA_ELIMIT, "bytes of string and list work", 10);
    /* the C stack: deep recursion through nested blocks */
    jinja_default_limits(&lim);
    lim.max_stack = 64 << 10;
    bounded("{% macro r(n) %}{% if true %}{% for x in [1] %}{% if true %}{{ r(n + 1) }}{% endif %}{% endfor %}{% endif %}"
            "{% endmacro %}{{ r(0) }}", &lim, JINJA_ELIMIT, "bytes of stack", 5);
    /* a template nested too deeply does not parse */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    size_t o = 0;
    o += (size_t)sprintf(deep, "{{ ");
    for (size_t i = 0; i < depth; i++) deep[o++] = '(';
    deep[o++] = '1';
    for (size_t i = 0; i < depth; i++) deep[o++] = ')';
    o += (size_t)sprintf(deep + o, " }}");
    char err[256];
    CHECK(jinja_parse(deep, o, err, sizeof err) == NULL && strstr(err, "nested too deeply"));
    o = 0;
    for (size_t i = 0; i < 1000; i++) o += (size_t)sprintf(deep + o, "{%% if x %%}");
    CHECK(jinja_parse(deep, o, err, sizeof err) == NULL && strstr(err, "nested too deeply"));
    /* inline ifs chained without parentheses nest too */
    o = (size_t)sprintf(deep, "{{ 1 ");
    for (size_t i = 0; i < 3000 && o + 16 < depth * 2; i++) o += (size_t)sprintf(deep + o, "if 1 ");
    o += (size_t)sprintf(deep + o, "}}");
    CHECK(jinja_parse(deep, o, err, sizeof err) == NULL && strstr(err, "nested too deeply"));
    free(deep);
    /* integers are 64-bit: what does not fit is an error, not a wrong number */
    bounded("{{ '%d' % 1e300 }}", NULL, JINJA_ERUNTIME, "OverflowError: integer too large", 1);
    bounded("{{ 2 ** 64 }}", NULL, JINJA_ERUNTIME, "OverflowError: integer too large", 1);
    bounded("{{ '%5.1000f|%*d|' % (1e300, -4, 5) }}", NULL, JINJA_OK, "", 1);
}

/* ---- the real templates ---- */

typedef struct tcache { char name[128]; jinja_tpl *t; char err[512]; } tcache;

static jinja_tpl *template_named(tcache *cache, size_t *n, const char *name, char *err, size_t errlen)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(cache[i].name, name)) {
            snprintf(err, errlen, "%s", cache[i].err);
            return cache[i].t;
        }
    tcache *c = &cache[(*n)++];
    snprintf(c->name, sizeof c->name, "%s", name);
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/chat/templates/%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(c->err, sizeof c->err, "%s: cannot open", path); return NULL; }
    char *src = malloc(1 << 20);
    size_t len = fread(src, 1, 1 << 20, f);
    fclose(f);
    c->t = jinja_parse(src, len, c->err, sizeof c->err);
    free(src);
    snprintf(err, errlen, "%s", c->err);
    return c->t;
}

static void run_renders(const char *path, size_t want_cases)
{
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    CHECKF(doc != NULL, "%s: %s (run `make fixtures`)", path, je.text);
    if (!doc) return;
    json_t *cases = json_object_get(doc, "cases");
    static tcache cache[128];
    size_t ncache = 0, texts = 0, raises = 0, match_text = 0, match_raise = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "template"));
        int want_error = json_is_true(json_object_get(c, "error"));
        char err[4096] = "", *out = NULL;
        size_t n = 0;
        jinja_tpl *t = template_named(cache, &ncache, name, err, sizeof err);
        int rc = t ? jinja_render(t, json_object_get(c, "vars"), fixed_now, NULL, &out, &n, err, sizeof err) : JINJA_ESYNTAX;
        if (want_error) {
            raises++;
            /* jinja2's message; where Python ran out of recursion, any bound */
            const char *type = json_string_value(json_object_get(c, "error_type"));
            const char *msg = json_string_value(json_object_get(c, "message"));
            int ok = rc != JINJA_OK && (strstr(err, msg) || (type && !strcmp(type, "RecursionError") && rc == JINJA_ELIMIT));
            CHECKF(ok, "%s case %d: want %s: %s; got rc %d: %s", name, (int)json_integer_value(json_object_get(c, "case")),
                   type, msg, rc, err);
            match_raise += ok;
        } else {
            texts++;
            const char *want = json_string_value(json_object_get(c, "text"));
            int ok = rc == JINJA_OK && n == strlen(want) && memcmp(out, want, n) == 0;
            if (!ok && rc == JINJA_OK) {
                size_t k = 0;
                while (k < n && want[k] == out[k]) k++;
                CHECKF(ok, "%s case %d: differs at byte %zu: want '%.60s' got '%.60s'", name,
                       (int)json_integer_value(json_object_get(c, "case")), k, want + k, out + k);
            } else {
                CHECKF(ok, "%s case %d: rc %d: %s", name, (int)json_integer_value(json_object_get(c, "case")), rc, err);
            }
            match_text += ok;
        }
        free(out);
    }
    fprintf(stderr, "  %s: %zu/%zu texts byte for byte, %zu/%zu raises\n", path, match_text, texts, match_raise, raises);
    CHECK_EQ_INT(texts + raises, want_cases);
    CHECK_EQ_INT(match_text + match_raise, texts + raises);
    for (size_t k = 0; k < ncache; k++) jinja_free(cache[k].t);
    json_decref(doc);
}

static void test_fixture_renders(void) { run_renders("bin/fixtures/chat/renders.dev.json", 408); }
static void test_extra_renders(void) { run_renders("bin/fixtures/chat/renders.extra.json", 2720); }

/* one parsed template rendered by several threads at once */
typedef struct job { jinja_tpl *t; json_t *vars; const char *want; int ok; } job;

static void *render_many(void *p)
{
    job *j = p;
    j->ok = 1;
    for (int i = 0; i < 200; i++) {
        char *out, err[256];
        size_t n;
        if (jinja_render(j->t, j->vars, fixed_now, NULL, &out, &n, err, sizeof err) != JINJA_OK || strcmp(out, j->want))
            j->ok = 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void)
{
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
                      "{{ '<' + m.role + '>' }}{{ m.content|upper }}{% endfor %}{{ ns.n }}{{ messages|tojson }}";
    char err[256];
    jinja_tpl *t = jinja_parse(src, strlen(src), err, sizeof err);
    json_t *v = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "messages", "role", "user", "content", "héllo", "role",
                          "assistant", "content", "wörld");
    const char *want = "<user>HÉLLO<assistant>WÖRLD10[{\"role\": \"user\", \"content\": \"héllo\"}, "
                       "{\"role\": \"assistant\", \"content\": \"wörld\"}]";
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){ t, v, want, 0 };
        pthread_create(&th[i], NULL, render_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok);
    }
    json_decref(v);
    jinja_free(t);
}

int main(void)
{
    struct tm tm = { .tm_year = 2026 - 1900, .tm_mon = 10, .tm_mday = 26, .tm_hour = 12, .tm_isdst = -1 };
    fixed_now = (int64_t)mktime(&tm);
    RUN(test_constructs);
    RUN(test_errors);
    RUN(test_syntax);
    RUN(test_api);
    RUN(test_bounds);
    RUN(test_threads);
    RUN(test_fixture_renders);
    RUN(test_extra_renders);
    return CHECK_DONE();
}
