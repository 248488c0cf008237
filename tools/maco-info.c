/*
 * maco-info - what MACO sees on this machine.
 *
 *   maco-info          version, CUDA devices and peer access between them
 *   maco-info --env    every MACO_* variable: type, default, current value, description
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "maco/maco.h"

static void print_env(void)
{
    printf("%-28s %-9s %-14s %-16s %s\n", "variable", "type", "default", "current", "description");
    for (int i = 0; i < maco_config_count(); i++) {
        maco_config_info_t info;
        if (maco_config_describe(i, &info) != MACO_OK)
            continue;
        printf("%-28s %-9s %-14s %-16s %s\n", info.name, info.type,
               info.default_value[0] ? info.default_value : "-",
               info.current ? info.current : "(unset)", info.doc);
    }
}

static int print_devices(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("CUDA devices: none visible (%s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "count 0");
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

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--env") == 0) {
        print_env();
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: maco-info [--env]\n");
        return argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) ? 0 : 2;
    }
    printf("MACO %s\n", maco_version_string());
    return print_devices();
}
