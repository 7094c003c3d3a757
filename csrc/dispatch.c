/* CPU feature detection and the one choice of kernel table.  Baseline flags
 * only: nothing here may execute an instruction the CPU might lack. */
#include <stddef.h>
#include <stdio.h>

#include "cfbn.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define CFBN_X86 1
#include <cpuid.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif

#if defined(CFBN_X86) && defined(CFBN_HAVE_AVX2)
/* AVX2 needs three things: the CPU has the instructions (cpuid), the OS
 * saves YMM registers on context switches (OSXSAVE, then XCR0 bits 1 and 2
 * via xgetbv), and the companions our AVX2 file is compiled with (FMA, F16C).
 * A CPU can report AVX2 while the OS has YMM state disabled; running AVX
 * code then faults. */
static int x86_has_avx2_fma_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    int osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, fma = (ecx >> 12) & 1, f16c = (ecx >> 29) & 1;
    if (!(osxsave && avx && fma && f16c)) return 0;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 0x6u) != 0x6u) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return (ebx >> 5) & 1;
}
#endif

const char *cfbn_isa_name(int isa)
{
    switch (isa) {
    case CFBN_ISA_SCALAR: return "scalar";
    case CFBN_ISA_AVX2: return "avx2";
    case CFBN_ISA_NEON: return "neon";
    default: return NULL;
    }
}

int cfbn_isa_compiled(int isa)
{
    switch (isa) {
    case CFBN_ISA_SCALAR: return 1;
#if defined(CFBN_HAVE_AVX2)
    case CFBN_ISA_AVX2: return 1;
#endif
#if defined(CFBN_HAVE_NEON)
    case CFBN_ISA_NEON: return 1;
#endif
    default: return 0;
    }
}

int cfbn_isa_supported(int isa)
{
    if (!cfbn_isa_compiled(isa)) return 0;
    switch (isa) {
    case CFBN_ISA_SCALAR: return 1;
#if defined(CFBN_HAVE_AVX2) && defined(CFBN_X86)
    case CFBN_ISA_AVX2: return x86_has_avx2_fma_f16c();
#endif
#if defined(CFBN_HAVE_NEON)
    case CFBN_ISA_NEON:
#if defined(__linux__)
        return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
        return 1;   /* Advanced SIMD is part of every AArch64 CPU */
#endif
#endif
    default: return 0;
    }
}

int cfbn_isa_best(void)
{
    static const int best_first[] = { CFBN_ISA_AVX2, CFBN_ISA_NEON, CFBN_ISA_SCALAR };
    for (size_t i = 0; i < sizeof best_first / sizeof best_first[0]; i++) {
        if (cfbn_isa_supported(best_first[i])) return best_first[i];
    }
    return CFBN_ISA_SCALAR;
}

const cfbn_kernels *cfbn_isa_table(int isa)
{
    if (!cfbn_isa_supported(isa)) return NULL;
    switch (isa) {
#if defined(CFBN_HAVE_AVX2)
    case CFBN_ISA_AVX2: return &cfbn_kernels_avx2;
#endif
#if defined(CFBN_HAVE_NEON)
    case CFBN_ISA_NEON: return &cfbn_kernels_neon;
#endif
    default: return &cfbn_kernels_scalar;
    }
}

/* One core's L2 cache in bytes, from Linux's description of cpu0's caches
 * (sysfs: the index whose level is 2 and whose type is Data or Unified), or
 * 0 where the OS does not say.  The router's channel-at-a-time threshold for
 * the gradient passes follows it (bn_route.c). */
int64_t cfbn_cpu_l2_bytes(void)
{
#if defined(__linux__)
    for (int i = 0; i < 16; i++) {
        char path[96], text[32] = "";
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        int ok = fscanf(f, "%d", &level) == 1;
        fclose(f);
        if (!ok || level != 2) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if ((f = fopen(path, "r")) != NULL) {
            ok = fscanf(f, "%31s", text) == 1 && text[0] != 'I';   /* not Instruction */
            fclose(f);
            if (!ok) continue;
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r"))) continue;
        long long size = 0;
        char unit = 0;
        int n = fscanf(f, "%lld%c", &size, &unit);
        fclose(f);
        if (n < 1 || size <= 0) continue;
        if (n == 2 && (unit == 'K' || unit == 'k')) size <<= 10;
        else if (n == 2 && (unit == 'M' || unit == 'm')) size <<= 20;
        return (int64_t)size;
    }
#endif
    return 0;
}
