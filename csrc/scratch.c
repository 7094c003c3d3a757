/* Per-thread kept blocks behind cfbn_scratch_alloc (scratch.h). */
#define _POSIX_C_SOURCE 200112L   /* posix_memalign under -std=c11 */
#include <pthread.h>
#include <stdlib.h>

#include "scratch.h"

typedef struct {
    void *block[CFBN_SCRATCH_SLOTS];
    size_t size[CFBN_SCRATCH_SLOTS];
    unsigned char used[CFBN_SCRATCH_SLOTS];
} pool;

static _Thread_local pool *mine;
static pthread_key_t pool_key;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static int pool_key_ok;

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}

/* Run when a thread that kept blocks exits. */
static void pool_destroy(void *v)
{
    pool *p = v;
    for (int i = 0; i < CFBN_SCRATCH_SLOTS; i++) free(p->block[i]);
    free(p);
    mine = NULL;
}

static void make_key(void)
{
    pool_key_ok = pthread_key_create(&pool_key, pool_destroy) == 0;
}

/* This thread's pool, created on its first call; NULL when none can be
 * made (every buffer then comes from the C library). */
static pool *this_pool(void)
{
    if (mine) return mine;
    pthread_once(&pool_once, make_key);
    if (!pool_key_ok) return NULL;
    pool *p = calloc(1, sizeof *p);
    if (p && pthread_setspecific(pool_key, p) != 0) {
        free(p);
        p = NULL;
    }
    mine = p;
    return p;
}

void *cfbn_scratch_alloc(size_t bytes)
{
    if (bytes == 0) bytes = 64;
    pool *p = bytes <= CFBN_SCRATCH_KEEP_BYTES ? this_pool() : NULL;
    if (!p) return alloc64(bytes);
    /* a kept block of exactly this size, else a slot to keep a new one in:
     * an empty one first, then a free one whose block is given back */
    int empty = -1, spare = -1;
    for (int i = 0; i < CFBN_SCRATCH_SLOTS; i++) {
        if (p->used[i]) continue;
        if (p->block[i] && p->size[i] == bytes) {
            p->used[i] = 1;
            return p->block[i];
        }
        if (!p->block[i] && empty < 0) empty = i;
        if (p->block[i] && spare < 0) spare = i;
    }
    int i = empty >= 0 ? empty : spare;
    if (i < 0) return alloc64(bytes);
    free(p->block[i]);
    p->block[i] = alloc64(bytes);
    p->size[i] = p->block[i] ? bytes : 0;
    p->used[i] = p->block[i] != NULL;
    return p->block[i];
}

void cfbn_scratch_free(void *q)
{
    if (!q) return;
    pool *p = mine;
    for (int i = 0; p && i < CFBN_SCRATCH_SLOTS; i++) {
        if (p->block[i] == q) {
            p->used[i] = 0;
            return;
        }
    }
    free(q);
}
