/* open.c — the backend by name: the build's backends and the choice
 * among them (CUDA first where built and no name is given). */
#include "engine/backend/backend.h"
#include "common/err.h"

#include <string.h>

const char *be_available(void)
{
#ifdef ANE_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}

int be_open_opts(be **out, const char *name, struct pool *p, const be_opts *o, char *err, size_t errlen)
{
    const be_opts dflt = { 0 };
    if (!o) o = &dflt;
#ifdef ANE_CUDA
    if (!name || !strcmp(name, "cuda")) {
        char cerr[256];
        if (be_cuda_open(out, p, o, cerr, sizeof cerr) == 0) return 0;
        if (name) return err_set(err, errlen, "cuda backend: %s", cerr);
    }
#endif
    if (name && strcmp(name, "cpu") != 0)
        return err_set(err, errlen, "backend '%s' is not available in this build (available: %s)", name,
                       be_available());
    return be_cpu_open(out, p, o->kv_type, err, errlen);
}

const char *be_kv_name(int kv_type)
{
    return kv_type == BE_KV_Q8_0 ? "q8_0" : kv_type == BE_KV_F16 ? "f16" : "f32";
}

int be_open(be **out, const char *name, struct pool *p, int kv_type, char *err, size_t errlen)
{
    be_opts o = { .kv_type = kv_type };
    return be_open_opts(out, name, p, &o, err, errlen);
}
