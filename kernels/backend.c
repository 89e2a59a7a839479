/* backend.c -- picks the backend a process runs on: the CPU's, built in,
 * or the CUDA one, a plugin (omni-cuda.so) loaded at run time.
 *
 * The CUDA backend lives in its own shared object so that one omni-engine
 * binary runs everywhere: it links nothing of CUDA, and a machine without
 * a GPU, a driver or even the CUDA libraries never loads them. The plugin
 * is found as OMNI_CUDA_LIB names it, else beside the running executable
 * (make builds both into build/). Whatever stops it (no plugin in this
 * build, a library missing, no device, too little memory) comes back as
 * one sentence: an error for "cuda", the reason in cfg->note for "auto",
 * which then runs on the CPU. */

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"

#define CUDA_PLUGIN "omni-cuda.so"

/* The plugin's path: OMNI_CUDA_LIB, else omni-cuda.so in the directory
 * of /proc/self/exe. */
static int plugin_path(char *path, size_t cap) {
    const char *env = getenv("OMNI_CUDA_LIB");
    char        exe[PATH_MAX];
    ssize_t     n;
    char       *slash;

    if (env != NULL && env[0] != '\0') {
        return snprintf(path, cap, "%s", env) < (int) cap ? 0 : -1;
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (slash == NULL) return -1;
    slash[1] = '\0';
    return snprintf(path, cap, "%s%s", exe, CUDA_PLUGIN) < (int) cap ? 0 : -1;
}

/* Whether the NVIDIA driver's library is there. Asked before the plugin
 * is loaded: loading it maps cuBLASLt (half a second and 200 MB on a
 * machine that has no GPU at all, on every start of "auto"). */
static bool driver_present(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);

    if (h == NULL) return false;
    dlclose(h);
    return true;
}

/* The CUDA backend, or NULL with err saying what is missing. The plugin
 * stays loaded for the process's life (its code backs the Backend). The
 * driver is looked for first only for the plugin found beside the
 * executable: one OMNI_CUDA_LIB names is loaded and asked, whatever it
 * is. */
static Backend *cuda_new(const BackendConfig *cfg, char *err, size_t errlen)
{
    char          path[PATH_MAX];
    void         *h;
    BackendNewFn  fn;
    Backend      *be;

    if (plugin_path(path, sizeof(path)) != 0) {
        snprintf(err, errlen, "cannot locate %s (set OMNI_CUDA_LIB)",
                 CUDA_PLUGIN);
        return NULL;
    }
    if (access(path, F_OK) != 0) {
        snprintf(err, errlen, getenv("OMNI_CUDA_LIB") != NULL
                 ? "%.90s (OMNI_CUDA_LIB) not found"
                 : "%.90s not found: this build has no CUDA backend (nvcc "
                   "was not found when it was built)", path);
        return NULL;
    }
    if (getenv("OMNI_CUDA_LIB") == NULL && !driver_present()) {
        snprintf(err, errlen, "no NVIDIA driver (libcuda.so.1 not found): "
                 "no GPU on this machine, or its driver is not installed");
        return NULL;
    }
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(err, errlen, "cannot load the CUDA backend: %.150s", dlerror());
        return NULL;
    }
    fn = (BackendNewFn) (uintptr_t) dlsym(h, BACKEND_CUDA_ENTRY);
    if (fn == NULL) {
        snprintf(err, errlen, "%.90s has no %s: not an omni-engine CUDA "
                 "backend", path, BACKEND_CUDA_ENTRY);
        dlclose(h);
        return NULL;
    }
    be = fn(cfg, err, errlen);
    if (be == NULL) dlclose(h);
    return be;
}

Backend *backend_new(BackendConfig *cfg, char *err, size_t errlen) {
    const char *want = cfg->backend != NULL ? cfg->backend : "auto";
    char        why[200];
    Backend    *be;

    cfg->note[0] = '\0';
    if (strcmp(want, "cpu") == 0) return backend_cpu_new(cfg, err, errlen);
    if (strcmp(want, "cuda") != 0 && strcmp(want, "auto") != 0) {
        snprintf(err, errlen, "backend must be auto, cpu or cuda, not '%s'",
                 want);
        return NULL;
    }
    be = cuda_new(cfg, why, sizeof(why));
    if (be != NULL) return be;
    if (strcmp(want, "cuda") == 0) {
        snprintf(err, errlen, "CUDA backend: %s", why);
        return NULL;
    }
    snprintf(cfg->note, sizeof(cfg->note), "no CUDA backend (%.200s): "
             "running on the CPU", why);
    return backend_cpu_new(cfg, err, errlen);
}
