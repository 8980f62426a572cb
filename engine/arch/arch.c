/* arch.c — the architecture table: one row for each architecture name. */
#include "engine/arch/arch.h"

#include <stdio.h>
#include <string.h>

static const arch archs[] = {
    /* name      family        options */
    { "llama",   &arch_llama,  ARCH_YARN },
    { "qwen2",   &arch_llama,  ARCH_ROPE_NEOX | ARCH_QKV_BIAS | ARCH_YARN },
    { "qwen3",   &arch_llama,  ARCH_ROPE_NEOX | ARCH_QK_NORM | ARCH_YARN },
    { "qwen3moe", &arch_llama, ARCH_ROPE_NEOX | ARCH_QK_NORM | ARCH_YARN },   /* (experts from expert_count) */
    { "qwen35",  &arch_qwen35, ARCH_ROPE_NEOX },
    { "gemma3",  &arch_gemma3, ARCH_ROPE_NEOX | ARCH_QK_NORM | ARCH_ROPE_LINEAR },
    { "gpt2",    &arch_gpt2,   0 },
    { "gpt-oss", &arch_gptoss, ARCH_ROPE_NEOX | ARCH_YARN | ARCH_YARN_EXACT },
};

const arch *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].name, name)) return &archs[i];
    return NULL;
}

const char *arch_names(char *buf, size_t n)
{
    size_t k = 0;
    if (n) buf[0] = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && k < n; i++) {
        int w = snprintf(buf + k, n - k, "%s%s", i ? ", " : "", archs[i].name);
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}
