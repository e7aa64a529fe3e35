/* The simulated machine's shape: defaults, or `key = value` lines from HAMI_SIM_CONFIG. */
#include "sim.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

static struct sim_config config;
static int config_ok;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static int parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    if (!isdigit((unsigned char)*text))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int copy_text(const char *text, char *out, size_t size)
{
    if (!*text || strlen(text) >= size)
        return -1;
    strcpy(out, text);
    return 0;
}

/* Keys that set the sim_config field of their name: numbers with their bounds, and texts. */
#define SIM_NUMBER_KEYS(X)                                                                          \
    X(devices, 1, SIM_MAX_DEVICES)                                                                  \
    X(memory_mib, 1, 1ULL << 24)                                                                    \
    X(sms, 1, 1024)                                                                                 \
    X(context_mib, 0, 1ULL << 24)                                                                   \
    X(cuda_version, 1000, 99999)                                                                    \
    X(stale_seconds, 1, 3600)                                                                       \
    X(kernel_us, 0, 60000000)                                                                       \
    X(launch_us, 0, 1000000)                                                                        \
    X(dispatch_us, 0, 1000000)                                                                      \
    X(timeslice_us, 0, 1000000)                                                                     \
    X(util_period_ms, 1, 1000)                                                                      \
    X(context_us, 0, 60000000)                                                                      \
    X(nvml_memory_info_us, 0, 600000000)                                                            \
    X(nvml_init_us, 0, 60000000)                                                                    \
    X(nvml_attach_us, 0, 60000000)                                                                  \
    X(self_calls, 0, 1)                                                                             \
    X(host_memory_mib, 0, 1ULL << 30)                                                               \
    X(brand, 0, 16)
#define SIM_TEXT_KEYS(X) X(name) X(driver_version) X(mig)

/* One key: 0 on success, -1 bad value, -2 unknown key. */
static int apply(struct sim_config *c, const char *key, const char *value)
{
    uint64_t v;
#define NUMBER_KEY(field, min, max)                                                                 \
    if (!strcmp(key, #field)) {                                                                     \
        if (parse_u64(value, min, max, &v))                                                         \
            return -1;                                                                              \
        c->field = v;                                                                               \
        return 0;                                                                                   \
    }
#define TEXT_KEY(field)                                                                             \
    if (!strcmp(key, #field))                                                                       \
        return copy_text(value, c->field, sizeof c->field);
    SIM_NUMBER_KEYS(NUMBER_KEY)
    SIM_TEXT_KEYS(TEXT_KEY)
#undef NUMBER_KEY
#undef TEXT_KEY
    return -2;
}

/* `mig`: the MIG instances, "<card>:<MiB>" each, comma-separated; a card with any is in
 * MIG mode. Each is a GPU instance (ids 1, 2, ... per card) with compute instance 0. */
static int parse_mig(struct sim_config *c)
{
    char text[sizeof c->mig];
    uint64_t used[SIM_MAX_DEVICES] = {0};
    int per_card[SIM_MAX_DEVICES] = {0};
    strcpy(text, c->mig);
    c->mig_count = 0;
    for (char *save = NULL, *item = strtok_r(text, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        uint64_t card, mib;
        if (!colon || c->mig_count == SIM_MAX_MIG)
            return -1;
        *colon = '\0';
        if (parse_u64(trim(item), 0, (uint64_t)c->devices - 1, &card) ||
            parse_u64(trim(colon + 1), 1, c->memory_mib, &mib) ||
            per_card[card] == SIM_MIG_PER_CARD || used[card] + mib > c->memory_mib)
            return -1;
        used[card] += mib;
        c->mig_instance[c->mig_count++] = (struct sim_mig){
            .card = (int)card, .gpu_instance = ++per_card[card], .compute_instance = 0, .memory_mib = mib};
    }
    return 0;
}

static int load_file(const char *path, struct sim_config *c)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "hami-sim: HAMI_SIM_CONFIG=%s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    char line[512];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (!*s)
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            fprintf(stderr, "hami-sim: %s:%d: expected 'key = value', got '%s'\n", path, lineno, s);
            rc = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        int r = apply(c, key, value);
        if (r == -2)
            fprintf(stderr, "hami-sim: %s:%d: unknown key '%s'\n", path, lineno, key);
        else if (r == -1)
            fprintf(stderr, "hami-sim: %s:%d: bad value for %s: '%s'\n", path, lineno, key, value);
        rc = r ? -1 : 0;
    }
    fclose(f);
    if (rc == 0 && c->mig[0] && parse_mig(c) < 0) {
        fprintf(stderr, "hami-sim: %s: bad value for mig: '%s' (<card>:<MiB>,... on cards below devices, "
                "at most %d per card, within its memory_mib)\n", path, c->mig, SIM_MIG_PER_CARD);
        rc = -1;
    }
    if (rc == 0 && c->context_mib >= c->memory_mib) {
        fprintf(stderr, "hami-sim: %s: context_mib %llu must be below memory_mib %llu\n", path,
                (unsigned long long)c->context_mib, (unsigned long long)c->memory_mib);
        rc = -1;
    }
    return rc;
}

#define SIM_NVIDIA_MAJOR 195

/* Which cards this process may use, decided as the real driver does: where the
 * control node exists (a container given its GPUs' nodes), a card is visible only
 * through its own /dev/nvidia<minor> character node of the NVIDIA major; a machine
 * without the control node (a host running the simulator, no real driver) sees
 * every card. HAMI_SIM_DEV_ROOT names another directory to look in (tests). */
static void find_visible(struct sim_config *c)
{
    const char *root = getenv("HAMI_SIM_DEV_ROOT");
    if (!root || !*root)
        root = "/dev";
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/nvidiactl", root);
    int restricted = stat(path, &st) == 0;
    c->visible = 0;
    for (int card = 0; card < c->devices; card++) {
        snprintf(path, sizeof path, "%s/nvidia%d", root, card);
        if (!restricted || (stat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == SIM_NVIDIA_MAJOR))
            c->card[c->visible++] = card;
    }
}

static void load(void)
{
    struct sim_config c = {
        .devices = 2, .memory_mib = 16384, .sms = 132, .name = "HAMi Simulated GPU",
        .context_mib = 300, .driver_version = "550.54.15", .cuda_version = 12040,
        .stale_seconds = 10, .kernel_us = 10, .launch_us = 3, .dispatch_us = 10, .timeslice_us = 2000, .util_period_ms = 167, .host_memory_mib = 65536, .brand = 14,
    };
    const char *path = getenv("HAMI_SIM_CONFIG");
    if (path && *path && load_file(path, &c))
        return;
    find_visible(&c);
    config = c;
    config_ok = 1;
}

const struct sim_config *sim_config(void)
{
    pthread_once(&config_once, load);
    return config_ok ? &config : NULL;
}

int sim_card(int dev) { return config.card[dev]; }

static void uuid_from_seed(uint64_t x, unsigned char out[16])
{
    for (int half = 0; half < 2; half++) {
        /* splitmix64 */
        x += 0x9e3779b97f4a7c15ULL;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        for (int i = 0; i < 8; i++)
            out[half * 8 + i] = (unsigned char)(z >> (8 * i));
    }
    out[6] = (unsigned char)((out[6] & 0x0f) | 0x40);
    out[8] = (unsigned char)((out[8] & 0x3f) | 0x80);
}

static void uuid_text(const char *prefix, const unsigned char u[16], char *out, size_t len)
{
    snprintf(out, len, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix,
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

/* Stable per card: the same card has the same UUID in every process and run. */
void sim_device_uuid(int dev, unsigned char out[16])
{
    uuid_from_seed(0x48414d6953494d00ULL + (uint64_t)sim_card(dev), out);
}

void sim_device_uuid_string(int dev, char *out, size_t len)
{
    unsigned char u[16];
    sim_device_uuid(dev, u);
    uuid_text("GPU", u, out, len);
}

/* Stable per card and GPU instance, as the card's own. */
void sim_mig_uuid_string(const struct sim_mig *mig, char *out, size_t len)
{
    unsigned char u[16];
    uuid_from_seed(0x48414d694d494700ULL + (uint64_t)mig->card * 64 + (uint64_t)mig->gpu_instance, u);
    uuid_text("MIG", u, out, len);
}

int sim_device_pci_bus(int dev) { return 0x18 + sim_card(dev) * 8; }
