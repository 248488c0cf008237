/*
 * maco-info - what MACO sees on this machine.
 *
 *   maco-info          version, the optional parts this build has ("built with", from CMake:
 *                      maco_build_info.h), CUDA devices and peer access between them; without
 *                      a usable device it says why and what to do, and exits 0
 *   maco-info --env    every MACO_* variable: type, default, current value, description;
 *                      a current value the library would reject is marked INVALID with what
 *                      the variable accepts, and a MACO_* variable the library does not know
 *                      is named with the closest known one. Exit status 1 when there is
 *                      either, else 0.
 *   maco-info --help   this usage, on standard output
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "maco/maco.h"
#include "maco_build_info.h"

extern char **environ;

/* `text` with control characters escaped (\n, \xNN), at most cap - 1 bytes: a value holding a
 * newline cannot make up a line of this table. Returns out. */
static const char *printable(const char *text, char *out, size_t cap)
{
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c != '\0' && o + 5 < cap; c++) {
        if (*c == '\n')
            o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (*c < 0x20 || *c == 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *c);
        else
            out[o++] = (char)*c;
    }
    out[o] = '\0';
    return out;
}

/* Prints the table; returns how many values are invalid or variables unknown. */
static int print_env(void)
{
    int problems = 0;
    printf("%-28s %-9s %-14s %-16s %s\n", "variable", "type", "default", "current", "description");
    for (int i = 0; i < maco_config_count(); i++) {
        maco_config_info_t info;
        if (maco_config_describe(i, &info) != MACO_OK)
            continue;
        char value[1024], why_text[1024];
        printf("%-28s %-9s %-14s %-16s %s\n", info.name, info.type,
               info.default_value[0] ? info.default_value : "-",
               info.current ? printable(info.current, value, sizeof(value)) : "(unset)", info.doc);
        char why[512];
        if (maco_config_validate(i, why, sizeof(why)) != MACO_OK) {
            printf("  ^ %s='%s' is INVALID (%s)\n", info.name,
                   printable(info.current ? info.current : "", value, sizeof(value)),
                   printable(why, why_text, sizeof(why_text)));
            problems++;
        }
    }
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "MACO_", 5) != 0)
            continue;
        char name[128];
        size_t len = strcspn(*e, "=");
        snprintf(name, sizeof(name), "%.*s", (int)(len < sizeof(name) ? len : sizeof(name) - 1),
                 *e);
        int closest = 0;
        maco_config_info_t near;
        if (maco_config_lookup(name, &closest) >= 0 ||
            maco_config_describe(closest, &near) != MACO_OK)
            continue;
        printf("%s: unknown variable, MACO ignores it (did you mean %s?)\n", name, near.name);
        problems++;
    }
    return problems;
}

static int print_devices(void)
{
    char why[512];
    int n = maco_cuda_device_count(why, sizeof(why));
    if (n == 0) {
        /* `why` names the cause and the next step (maco_cuda_device_count). */
        printf("CUDA devices: none usable: %s\n", why);
        return 0;
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("CUDA driver %d.%d, runtime %d.%d, %d device(s)\n", driver / 1000, (driver % 1000) / 10,
           runtime / 1000, (runtime % 1000) / 10, n);
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess)
            continue;
        printf("  device %d: %s, sm_%d%d, %d SMs, %.1f GiB, PCI %04x:%02x:%02x\n", d, p.name,
               p.major, p.minor, p.multiProcessorCount,
               (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), p.pciDomainID, p.pciBusID,
               p.pciDeviceID);
    }
    if (n > 1) {
        printf("peer access (row can access column):\n    ");
        for (int j = 0; j < n; j++)
            printf(" %3d", j);
        printf("\n");
        for (int i = 0; i < n; i++) {
            printf("  %2d", i);
            for (int j = 0; j < n; j++) {
                int ok = 0;
                if (i != j)
                    cudaDeviceCanAccessPeer(&ok, i, j);
                printf(" %3s", i == j ? "-" : (ok ? "yes" : "no"));
            }
            printf("\n");
        }
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: maco-info [--env | --help]\n"
               "  (none)  MACO's version, the optional parts this build has (built with), the\n"
               "          CUDA devices and the peer access between them\n"
               "  --env   every MACO_* variable: type, default, current value, description;\n"
               "          exit status 1 when a value is invalid or a MACO_* name unknown\n"
               "  --help  this text\n");
}

static void print_part(const char *name, int built, const char *note)
{
    printf("  %-30s %s: %s\n", name, built ? "built" : "not built", note);
}

/* The optional parts, as CMake configured them (maco_build_info.h). */
static void print_built_with(void)
{
    printf("built with:\n");
    print_part("IB verbs transport", MACO_BUILT_IB, MACO_BUILT_IB_NOTE);
    print_part("NCCL-compatible libnccl.so.2", MACO_BUILT_NCCL, MACO_BUILT_NCCL_NOTE);
    print_part("GEMM tiles through cuBLASDx", MACO_BUILT_CUBLASDX, MACO_BUILT_CUBLASDX_NOTE);
    print_part("GEMM tiles through SM90 GMMA", MACO_BUILT_GMMA, MACO_BUILT_GMMA_NOTE);
    print_part("Python bindings", MACO_BUILT_PYTHON, MACO_BUILT_PYTHON_NOTE);
    printf("  %-30s %s\n", "CUDA architectures", MACO_BUILT_CUDA_ARCHS);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
    if (argc == 2 && strcmp(argv[1], "--env") == 0)
        return print_env() > 0 ? 1 : 0;
    if (argc > 1) {
        fprintf(stderr, "maco-info: unknown argument '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    printf("MACO %s\n", maco_version_string());
    print_built_with();
    return print_devices();
}
