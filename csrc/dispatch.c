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

/* ---- CPU and OS checks, one per ISA (0 where the ISA is not compiled) ---- */

static int scalar_ok(void)
{
    return 1;
}

#if defined(CFBN_X86) && (defined(CFBN_HAVE_AVX2) || defined(CFBN_HAVE_AVX512))
#define CFBN_X86_ISA 1
#endif

/* XCR0 (xgetbv 0): which register states the OS saves on context switches */
#if defined(CFBN_X86_ISA)
static unsigned xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}
#endif

/* AVX2 needs three things: the CPU has the instructions (cpuid), the OS
 * saves YMM registers on context switches (OSXSAVE, then XCR0 bits 1 and 2
 * via xgetbv), and the companions our AVX2 file is compiled with (FMA, F16C).
 * A CPU can report AVX2 while the OS has YMM state disabled; running AVX
 * code then faults. */
#if defined(CFBN_X86_ISA)
static int avx2_cpu(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    int osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, fma = (ecx >> 12) & 1, f16c = (ecx >> 29) & 1;
    if (!(osxsave && avx && fma && f16c)) return 0;
    if ((xcr0() & 0x6u) != 0x6u) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return (ebx >> 5) & 1;
}
#endif

static int avx2_ok(void)
{
#if defined(CFBN_HAVE_AVX2)
    return avx2_cpu();
#else
    return 0;
#endif
}

/* AVX-512: everything AVX2 needs, the F, DQ, BW and VL subsets (cpuid 7:
 * EBX bits 16, 17, 30, 31) and the OS saving the opmask and ZMM state too
 * (XCR0 bits 5, 6 and 7). */
static int avx512_ok(void)
{
#if defined(CFBN_X86) && defined(CFBN_HAVE_AVX512)
    if (!avx2_cpu() || (xcr0() & 0xe6u) != 0xe6u) return 0;
    unsigned eax, ebx, ecx, edx;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    return (ebx & need) == need;
#else
    return 0;
#endif
}

static int neon_ok(void)
{
#if defined(CFBN_HAVE_NEON) && defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#elif defined(CFBN_HAVE_NEON)
    return 1;   /* Advanced SIMD is part of every AArch64 CPU */
#else
    return 0;
#endif
}

#if defined(CFBN_HAVE_AVX2)
#define AVX2_TABLE (&cfbn_kernels_avx2)
#else
#define AVX2_TABLE NULL
#endif
#if defined(CFBN_HAVE_NEON)
#define NEON_TABLE (&cfbn_kernels_neon)
#else
#define NEON_TABLE NULL
#endif
#if defined(CFBN_HAVE_AVX512)
#define AVX512_TABLE (&cfbn_kernels_avx512)
#else
#define AVX512_TABLE NULL
#endif

static int always(void)
{
    return 1;
}

/* Whether a CPU that runs AVX-512 gets it for every family without
 * CFBN_FORCE_ISA: only where it has been measured faster than AVX2 in every
 * family (512-bit units that are split in two, or a clock that drops under
 * 512-bit load, make it slower on some CPUs).  No CPU has been, so none
 * does; the CPU rows below give it the families it wins. */
static int avx512_by_default(void)
{
    return 0;
}

/* ---- the ISAs, best first: the first one this CPU and OS run, and that it
 * takes by default, is the default ---- */

typedef struct {
    int isa;                       /* enum cfbn_isa */
    const char *name;              /* as CFBN_FORCE_ISA spells it */
    int (*cpu_ok)(void);           /* the CPU has it and the OS saves its registers */
    const cfbn_kernels *table;     /* NULL where its file is not compiled in */
    int (*by_default)(void);       /* chosen without CFBN_FORCE_ISA where it runs */
} isa_row;

static const isa_row isa_rows[] = {
    { CFBN_ISA_AVX512, "avx512", avx512_ok, AVX512_TABLE, avx512_by_default },
    { CFBN_ISA_AVX2, "avx2", avx2_ok, AVX2_TABLE, always },
    { CFBN_ISA_NEON, "neon", neon_ok, NEON_TABLE, always },
    { CFBN_ISA_SCALAR, "scalar", scalar_ok, &cfbn_kernels_scalar, always },
};
_Static_assert(sizeof isa_rows / sizeof isa_rows[0] == CFBN_ISA_COUNT, "one row per enum cfbn_isa");

static const isa_row *row_of(int isa)
{
    for (size_t i = 0; i < CFBN_ISA_COUNT; i++)
        if (isa_rows[i].isa == isa) return &isa_rows[i];
    return NULL;
}

const char *cfbn_isa_name(int isa)
{
    const isa_row *r = row_of(isa);
    return r ? r->name : NULL;
}

int cfbn_isa_compiled(int isa)
{
    const isa_row *r = row_of(isa);
    return r && r->table;
}

int cfbn_isa_supported(int isa)
{
    const isa_row *r = row_of(isa);
    return r && r->table && r->cpu_ok();
}

int cfbn_isa_best(void)
{
    for (size_t i = 0; i < CFBN_ISA_COUNT; i++)
        if (isa_rows[i].table && isa_rows[i].cpu_ok() && isa_rows[i].by_default()) return isa_rows[i].isa;
    return CFBN_ISA_SCALAR;
}

const cfbn_kernels *cfbn_isa_table(int isa)
{
    return cfbn_isa_supported(isa) ? row_of(isa)->table : NULL;
}

/* ---- CPU rows: on a CPU measured by benchmarks/isa_classes.py, each loop
 * family from the ISA that ran it fastest there (the default table; a
 * forced ISA runs every family) ---- */

/* x86 family and model (cpuid 1, with the extended fields), vendor AMD */
#if defined(CFBN_X86)
static int amd_family_model(unsigned *family, unsigned *model)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return 0;
    /* "AuthenticAMD" in EBX, EDX, ECX */
    if (ebx != 0x68747541u || edx != 0x69746e65u || ecx != 0x444d4163u) return 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    unsigned base = (eax >> 8) & 0xf;
    *family = base == 0xf ? base + ((eax >> 20) & 0xff) : base;
    *model = ((eax >> 4) & 0xf) | (base == 0xf ? ((eax >> 16) & 0xf) << 4 : 0);
    return 1;
}
#endif

/* AMD Zen 4 (family 19h with AVX-512; Zen 3, the same family, has none):
 * 512-bit operations run as two 256-bit halves.  Measured on an EPYC (family
 * 19h, model 11h), 2 threads, AVX-512 / AVX2 time by family
 * (benchmarks/results/isa_classes_zen4.txt): plain 1.02-1.09, relu family
 * 1.00-1.04, exp family 0.72-0.74, second order 1.04-1.06, bfloat16 plain
 * 0.87-0.98, float16 plain 1.34 (three runs, two of them before the
 * float16 family was measured). */
static int zen4(void)
{
#if defined(CFBN_X86)
    unsigned family, model;
    return avx512_ok() && amd_family_model(&family, &model) && family == 0x19;
#else
    return 0;
#endif
}

typedef struct {
    const char *name;
    int (*match)(void);
    int isa[CFBN_FAMILY_COUNT];    /* enum cfbn_isa per enum cfbn_family */
} cpu_row;

static const cpu_row cpu_rows[] = {
    { "amd-zen4", zen4, { [CFBN_FAMILY_PLAIN] = CFBN_ISA_AVX2,
                          [CFBN_FAMILY_PLAIN_F16] = CFBN_ISA_AVX2,
                          [CFBN_FAMILY_PLAIN_BF16] = CFBN_ISA_AVX512,
                          [CFBN_FAMILY_RELU] = CFBN_ISA_AVX2,
                          [CFBN_FAMILY_EXP] = CFBN_ISA_AVX512,
                          [CFBN_FAMILY_SECOND_ORDER] = CFBN_ISA_AVX2 } },
};

/* The routed table: a copy of the best ISA's with its by_family.  Every
 * driver entry switches to the family's table before it plans (the plan
 * takes that table's lanes), so the copy's own entries never run.  Made
 * once, on first use; cfbn._kernels asks at import, before any thread
 * runs. */
static cfbn_kernels routed_table;
static const cfbn_kernels *routed_families[CFBN_FAMILY_COUNT];
static const cpu_row *matched_row;
static int default_made;

static const cfbn_kernels *make_default(void)
{
    const cfbn_kernels *best = cfbn_isa_table(cfbn_isa_best());
    for (size_t i = 0; i < sizeof cpu_rows / sizeof cpu_rows[0]; i++) {
        const cpu_row *r = &cpu_rows[i];
        if (!r->match()) continue;
        int ok = 1;
        for (int f = 0; f < CFBN_FAMILY_COUNT; f++)
            if ((routed_families[f] = cfbn_isa_table(r->isa[f])) == NULL) ok = 0;
        if (!ok) continue;
        routed_table = *best;
        routed_table.by_family = routed_families;
        matched_row = r;
        return &routed_table;
    }
    return best;
}

const cfbn_kernels *cfbn_default_table(void)
{
    static const cfbn_kernels *table;
    if (!default_made) {
        table = make_default();
        default_made = 1;
    }
    return table;
}

const char *cfbn_cpu_row(void)
{
    cfbn_default_table();
    return matched_row ? matched_row->name : NULL;
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
