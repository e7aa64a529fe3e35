/* Every handle the driver gives out is registered here, so that a call with an
 * unknown, freed or wrong-kind handle is refused instead of dereferenced. */
#include "sim.h"

#include <stdlib.h>

#define BUCKETS 4096

struct entry {
    uintptr_t key;
    int kind;
    void *val;
    struct entry *next;
};

static struct entry *buckets[BUCKETS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket_of(uintptr_t key) { return (unsigned)((key >> 4) * 0x9e3779b97f4a7c15ULL >> 52) % BUCKETS; }

void sim_handle_put(uintptr_t key, int kind, void *val)
{
    struct entry *e = malloc(sizeof *e);
    if (!e)
        abort();
    *e = (struct entry){key, kind, val, NULL};
    pthread_mutex_lock(&lock);
    unsigned b = bucket_of(key);
    e->next = buckets[b];
    buckets[b] = e;
    pthread_mutex_unlock(&lock);
}

void *sim_handle_get(uintptr_t key, int kind)
{
    void *val = NULL;
    pthread_mutex_lock(&lock);
    for (struct entry *e = buckets[bucket_of(key)]; e; e = e->next)
        if (e->key == key && e->kind == kind) {
            val = e->val;
            break;
        }
    pthread_mutex_unlock(&lock);
    return val;
}

void *sim_handle_take(uintptr_t key, int kind)
{
    void *val = NULL;
    pthread_mutex_lock(&lock);
    for (struct entry **pe = &buckets[bucket_of(key)]; *pe; pe = &(*pe)->next) {
        struct entry *e = *pe;
        if (e->key == key && e->kind == kind) {
            val = e->val;
            *pe = e->next;
            free(e);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return val;
}

void *sim_handle_find(int kind, int (*match)(void *val, void *arg), void *arg)
{
    void *val = NULL;
    pthread_mutex_lock(&lock);
    for (unsigned b = 0; b < BUCKETS && !val; b++)
        for (struct entry *e = buckets[b]; e; e = e->next)
            if (e->kind == kind && match(e->val, arg)) {
                val = e->val;
                break;
            }
    pthread_mutex_unlock(&lock);
    return val;
}
