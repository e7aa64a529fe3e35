/* What libvgpu charged, by driver handle: a chained hash table with striped locks,
 * so frees on many threads do not serialise on one mutex. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

#define BUCKETS 4096
#define STRIPES 64

struct node {
    struct hami_res res;
    struct node *next;
};

static struct node *buckets[BUCKETS];
static pthread_mutex_t stripes[STRIPES] = {[0 ... STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER};

static unsigned bucket_of(int kind, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 52) % BUCKETS;
}

void hami_res_put(const struct hami_res *res)
{
    struct node *n = malloc(sizeof *n);
    if (!n)
        return;   /* out of host memory: the charge stays until the process exits */
    n->res = *res;
    unsigned b = bucket_of(res->kind, res->key);
    pthread_mutex_lock(&stripes[b % STRIPES]);
    n->next = buckets[b];
    buckets[b] = n;
    pthread_mutex_unlock(&stripes[b % STRIPES]);
}

int hami_res_take(int kind, uint64_t key, struct hami_res *out)
{
    unsigned b = bucket_of(kind, key);
    struct node *found = NULL;
    pthread_mutex_lock(&stripes[b % STRIPES]);
    for (struct node **pp = &buckets[b]; *pp; pp = &(*pp)->next) {
        if ((*pp)->res.kind == kind && (*pp)->res.key == key) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&stripes[b % STRIPES]);
    if (!found)
        return -1;
    if (out)
        *out = found->res;
    free(found);
    return 0;
}

int hami_res_get(int kind, uint64_t key, struct hami_res *out)
{
    unsigned b = bucket_of(kind, key);
    int found = -1;
    pthread_mutex_lock(&stripes[b % STRIPES]);
    for (struct node *n = buckets[b]; n && found < 0; n = n->next)
        if (n->res.kind == kind && n->res.key == key) {
            *out = n->res;
            found = 0;
        }
    pthread_mutex_unlock(&stripes[b % STRIPES]);
    return found;
}

void hami_res_take_ctx(CUcontext ctx, void (*fn)(const struct hami_res *res))
{
    if (!ctx)
        return;
    for (unsigned b = 0; b < BUCKETS; b++) {
        struct node *taken = NULL;
        pthread_mutex_lock(&stripes[b % STRIPES]);
        for (struct node **pp = &buckets[b]; *pp;) {
            if ((*pp)->res.ctx == ctx) {
                struct node *n = *pp;
                *pp = n->next;
                n->next = taken;
                taken = n;
            } else {
                pp = &(*pp)->next;
            }
        }
        pthread_mutex_unlock(&stripes[b % STRIPES]);
        while (taken) {
            struct node *next = taken->next;
            fn(&taken->res);
            free(taken);
            taken = next;
        }
    }
}
