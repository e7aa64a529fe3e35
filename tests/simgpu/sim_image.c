/*
 * Module images: what kind an image is and which kernels it holds, read the
 * way the driver reads them (nothing is compiled or run).
 *
 * - fat binary: the wrapper the compiler emits (magic 0x466243B1, pointing at
 *   the fat binary) or the fat binary itself (magic 0xBA55ED50, a 16-byte
 *   header, then entries: a header of `header_size` bytes, then
 *   `payload_size` bytes of PTX text or an ELF cubin). As the driver does, the
 *   module is the one entry the device runs: the cubin built for its SM (the
 *   highest of its major version not above it), else the PTX of the highest
 *   version it can compile; none: CUDA_ERROR_NO_BINARY_FOR_GPU. A compressed
 *   entry (nvcc's fat binary compression: LZ4 or Zstandard, as in PyTorch's
 *   and the CUDA libraries' images) is decompressed with the system's
 *   liblz4.so.1 or libzstd.so.1; where the process cannot load that library
 *   the entry is "opaque": any kernel name resolves in it and it holds no
 *   globals that can be found.
 * - ELF cubin: the kernels are its function symbols marked as entry points.
 * - PTX text: the kernels are its `.entry` directives.
 * - anything else is a simulator test image (a short string such as "any
 *   image"): it holds the test kernels `spin`, `sleep_kernel` and `empty`.
 * A test kernel's first parameter is its duration in microseconds, in whatever
 * image it is (cu_launch.c).
 */
#include "sim.h"

#include <ctype.h>
#include <dlfcn.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u
#define ENTRY_PTX 1
#define ENTRY_ELF 2
#define ENTRY_LZ4 0x2000ull
#define ENTRY_ZSTD 0x8000ull
#define ENTRY_MAX_UNCOMPRESSED (1ull << 30)
#define STO_CUDA_ENTRY 0x10              /* st_other of a cubin's kernel symbols */

struct fatbin_wrapper { uint32_t magic, version; const void *data; const void *prelinked; };
struct fatbin_header { uint32_t magic; uint16_t version, header_size; uint64_t size; };
struct fatbin_entry {
    uint16_t kind, version;
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t compressed_size, reserved0;
    uint16_t ptx_minor, ptx_major;
    uint32_t arch;                       /* SM version: 90 for 9.0 */
    uint32_t name_offset, name_size;
    uint64_t flags, reserved1, uncompressed_size;
};
static const char *const test_kernels[] = {"spin", "sleep_kernel", "empty"};

static int add_name(struct sim_image *img, const char *name, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < img->count; i++)
        if (strlen(img->names[i]) == len && !memcmp(img->names[i], name, len))
            return 0;
    char **names = realloc(img->names, (img->count + 1) * sizeof *names);
    if (!names)
        return -1;
    img->names = names;
    if (!(names[img->count] = strndup(name, len)))
        return -1;
    img->count++;
    return 0;
}

static int ptx_ident(int c) { return isalnum(c) || c == '_' || c == '$' || c == '%'; }

/* `.entry name(` for every kernel of a PTX text of `len` bytes. */
static int parse_ptx(const char *text, size_t len, struct sim_image *img)
{
    static const char directive[] = ".entry";
    const size_t dlen = sizeof directive - 1;
    for (size_t i = 0; i + dlen < len; i++) {
        if (memcmp(text + i, directive, dlen) || !isspace((unsigned char)text[i + dlen]) ||
            (i > 0 && ptx_ident((unsigned char)text[i - 1])))
            continue;
        size_t p = i + dlen;
        while (p < len && isspace((unsigned char)text[p]))
            p++;
        size_t start = p;
        while (p < len && ptx_ident((unsigned char)text[p]))
            p++;
        if (add_name(img, text + start, p - start) < 0)
            return -1;
    }
    return 0;
}

static int looks_like_ptx(const char *text, size_t len)
{
    return memmem(text, len, ".version", 8) || memmem(text, len, ".entry", 6);
}

/* The kernels of a 64-bit ELF cubin: its function symbols marked as entry points (whatever their
 * binding: a kernel in an anonymous namespace is a local symbol); `len` bounds every read
 * (SIZE_MAX: trust the headers). */
static int parse_elf(const unsigned char *elf, size_t len, struct sim_image *img)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)elf;
    if (len < sizeof *eh || eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
        eh->e_shoff > len || eh->e_shnum > (len - eh->e_shoff) / sizeof(Elf64_Shdr))
        return -1;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(elf + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
            continue;
        const Elf64_Shdr *strtab = &sh[sh[i].sh_link];
        if (sh[i].sh_offset > len || sh[i].sh_size > len - sh[i].sh_offset || strtab->sh_offset > len ||
            strtab->sh_size > len - strtab->sh_offset)
            return -1;
        const Elf64_Sym *sym = (const Elf64_Sym *)(elf + sh[i].sh_offset);
        const char *names = (const char *)elf + strtab->sh_offset;
        for (size_t k = 0; k < sh[i].sh_size / sizeof *sym; k++) {
            if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || !(sym[k].st_other & STO_CUDA_ENTRY) ||
                sym[k].st_name >= strtab->sh_size)
                continue;
            const char *name = names + sym[k].st_name;
            if (add_name(img, name, strnlen(name, strtab->sh_size - sym[k].st_name)) < 0)
                return -1;
        }
    }
    return 0;
}

/* The system's decompressors, loaded on first need: the calls used, declared as zstd.h and lz4.h do. */
typedef size_t (*zstd_decompress_fn)(void *dst, size_t capacity, const void *src, size_t size);
typedef unsigned (*zstd_is_error_fn)(size_t code);
typedef int (*lz4_decompress_fn)(const char *src, char *dst, int size, int capacity);
static struct {
    zstd_decompress_fn zstd_decompress;
    zstd_is_error_fn zstd_is_error;
    lz4_decompress_fn lz4_decompress;
} codecs;
static pthread_once_t codecs_once = PTHREAD_ONCE_INIT;

static void codecs_load(void)
{
    void *zstd = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL), *lz4 = dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL);
    codecs.zstd_decompress = zstd ? (zstd_decompress_fn)dlsym(zstd, "ZSTD_decompress") : NULL;
    codecs.zstd_is_error = zstd ? (zstd_is_error_fn)dlsym(zstd, "ZSTD_isError") : NULL;
    codecs.lz4_decompress = lz4 ? (lz4_decompress_fn)dlsym(lz4, "LZ4_decompress_safe") : NULL;
    if (!codecs.zstd_is_error)
        codecs.zstd_decompress = NULL;
    if (getenv("HAMI_SIM_TRACE") && (!codecs.zstd_decompress || !codecs.lz4_decompress))
        fprintf(stderr, "hami-sim: %s cannot be loaded: fat binary entries it compressed are opaque\n",
                !codecs.zstd_decompress ? "libzstd.so.1" : "liblz4.so.1");
}

/* The entry the device runs (see the header comment); CUDA_ERROR_INVALID_IMAGE when the
 * fat binary is malformed, CUDA_ERROR_NO_BINARY_FOR_GPU when nothing in it runs here. */
static CUresult fatbin_choose(const struct fatbin_header *fh, const struct fatbin_entry **out)
{
    if (fh->version != 1 || fh->header_size < sizeof *fh)
        return CUDA_ERROR_INVALID_IMAGE;
    const unsigned char *p = (const unsigned char *)fh + fh->header_size, *end = p + fh->size;
    const struct fatbin_entry *cubin = NULL, *ptx = NULL;
    while (p + sizeof(struct fatbin_entry) <= end) {
        const struct fatbin_entry *e = (const struct fatbin_entry *)p;
        if (e->header_size < sizeof *e || e->header_size > (uint64_t)(end - p) ||
            e->payload_size > (uint64_t)(end - p) - e->header_size)
            return CUDA_ERROR_INVALID_IMAGE;
        if (e->kind == ENTRY_ELF && e->arch / 10 == SIM_SM_VERSION / 10 && e->arch <= SIM_SM_VERSION &&
            (!cubin || e->arch > cubin->arch))
            cubin = e;
        else if (e->kind == ENTRY_PTX && e->arch <= SIM_SM_VERSION && (!ptx || e->arch > ptx->arch))
            ptx = e;
        p += e->header_size + e->payload_size;
    }
    *out = cubin ? cubin : ptx;
    return *out ? CUDA_SUCCESS : CUDA_ERROR_NO_BINARY_FOR_GPU;
}

/* An entry's payload as the driver reads it: a NUL-terminated copy, decompressed (free it).
 * NULL with CUDA_SUCCESS: compressed by a codec this process cannot load (opaque). */
static CUresult entry_bytes(const struct fatbin_entry *e, unsigned char **out, size_t *len)
{
    const unsigned char *payload = (const unsigned char *)e + e->header_size;
    *out = NULL;
    if (!(e->flags & (ENTRY_ZSTD | ENTRY_LZ4))) {
        if (!(*out = malloc(e->payload_size + 1)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(*out, payload, e->payload_size);
        *len = e->payload_size;
        (*out)[*len] = 0;
        return CUDA_SUCCESS;
    }
    pthread_once(&codecs_once, codecs_load);
    int zstd = (e->flags & ENTRY_ZSTD) != 0;
    if (zstd ? !codecs.zstd_decompress : !codecs.lz4_decompress)
        return CUDA_SUCCESS;
    uint64_t size = e->uncompressed_size;
    if (!size || size > ENTRY_MAX_UNCOMPRESSED || !e->compressed_size || e->compressed_size > e->payload_size)
        return CUDA_ERROR_INVALID_IMAGE;
    if (!(*out = malloc(size + 1)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int ok;
    if (zstd) {
        size_t got = codecs.zstd_decompress(*out, size, payload, e->compressed_size);
        ok = !codecs.zstd_is_error(got) && got == size;
    } else {
        ok = codecs.lz4_decompress((const char *)payload, (char *)*out, (int)e->compressed_size, (int)size) ==
             (int)size;
    }
    if (!ok) {
        free(*out);
        *out = NULL;
        return CUDA_ERROR_INVALID_IMAGE;
    }
    *len = size;
    (*out)[*len] = 0;
    return CUDA_SUCCESS;
}

/* The chosen entry of a fat binary, read (see entry_bytes), and its kind. */
static CUresult fatbin_module(const struct fatbin_header *fh, unsigned char **bytes, size_t *len, int *kind)
{
    const struct fatbin_entry *e;
    CUresult rc = fatbin_choose(fh, &e);
    if (rc != CUDA_SUCCESS)
        return rc;
    *kind = e->kind;
    return entry_bytes(e, bytes, len);
}

static CUresult parse_fatbin(const struct fatbin_header *fh, struct sim_image *img)
{
    unsigned char *bytes;
    size_t len;
    int kind;
    CUresult rc = fatbin_module(fh, &bytes, &len, &kind);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!bytes)
        img->opaque = 1;
    else if ((kind == ENTRY_PTX ? parse_ptx((const char *)bytes, len, img) : parse_elf(bytes, len, img)) < 0)
        rc = CUDA_ERROR_INVALID_IMAGE;
    free(bytes);
    return rc;
}

static uint32_t image_magic(const void *image)
{
    uint32_t magic = 0;  /* the binary magics have no zero byte: a shorter text is never one */
    if (strnlen(image, sizeof magic) == sizeof magic)
        memcpy(&magic, image, sizeof magic);
    return magic;
}

static int is_elf(const void *image) { return image_magic(image) && !memcmp(image, ELFMAG, SELFMAG); }

CUresult sim_image_parse(const void *image, struct sim_image *img)
{
    *img = (struct sim_image){0};
    uint32_t magic = image_magic(image);
    int rc = 0;
    if (magic == WRAPPER_MAGIC || magic == FATBIN_MAGIC) {
        const struct fatbin_header *fh = sim_image_unwrap(image);
        img->kind = SIM_IMAGE_FATBIN;
        CUresult fat = fh && fh->magic == FATBIN_MAGIC ? parse_fatbin(fh, img) : CUDA_ERROR_INVALID_IMAGE;
        if (fat != CUDA_SUCCESS) {
            sim_image_free(img);
            return fat;
        }
    } else if (is_elf(image)) {
        img->kind = SIM_IMAGE_ELF;
        rc = parse_elf(image, SIZE_MAX, img);
    } else if (looks_like_ptx(image, strlen(image))) {
        img->kind = SIM_IMAGE_PTX;
        rc = parse_ptx(image, strlen(image), img);
    } else {
        img->kind = SIM_IMAGE_TEST;
        for (size_t i = 0; i < sizeof test_kernels / sizeof *test_kernels && rc == 0; i++)
            rc = add_name(img, test_kernels[i], strlen(test_kernels[i]));
    }
    if (rc < 0) {
        sim_image_free(img);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    return CUDA_SUCCESS;
}

int sim_image_test_kernel(const char *name)
{
    for (size_t i = 0; i < sizeof test_kernels / sizeof *test_kernels; i++)
        if (!strcmp(test_kernels[i], name))
            return 1;
    return 0;
}

const char *sim_image_kernel(const struct sim_image *img, const char *name)
{
    for (size_t i = 0; i < img->count; i++)
        if (!strcmp(img->names[i], name))
            return img->names[i];
    return NULL;
}

void sim_image_free(struct sim_image *img)
{
    for (size_t i = 0; i < img->count; i++)
        free(img->names[i]);
    free(img->names);
    *img = (struct sim_image){0};
}

const void *sim_image_unwrap(const void *image)
{
    const struct fatbin_wrapper *w = image;
    return w->magic == WRAPPER_MAGIC && w->data ? w->data : image;
}

/* The section header `i` of an ELF image (entries are e_shentsize apart). */
static const Elf64_Shdr *elf_section(const unsigned char *elf, uint64_t i)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)elf;
    return (const Elf64_Shdr *)(elf + eh->e_shoff + i * eh->e_shentsize);
}

size_t sim_image_size(const void *image)
{
    const unsigned char *p = image;
    if (image_magic(image) == FATBIN_MAGIC) {
        const struct fatbin_header *fh = image;
        return fh->header_size + fh->size;
    }
    if (is_elf(image) && p[EI_CLASS] == ELFCLASS64) {
        const Elf64_Ehdr *eh = image;
        uint64_t end = sizeof *eh;
        if (eh->e_phoff + (uint64_t)eh->e_phnum * eh->e_phentsize > end)
            end = eh->e_phoff + (uint64_t)eh->e_phnum * eh->e_phentsize;
        if (eh->e_shoff + (uint64_t)eh->e_shnum * eh->e_shentsize > end)
            end = eh->e_shoff + (uint64_t)eh->e_shnum * eh->e_shentsize;
        for (uint64_t i = 0; i < eh->e_shnum; i++) {
            const Elf64_Shdr *sh = elf_section(p, i);
            if (sh->sh_type != SHT_NOBITS && sh->sh_offset + sh->sh_size > end)
                end = sh->sh_offset + sh->sh_size;
        }
        return end;
    }
    return strlen(image) + 1;
}

/* A cubin's object symbol `name`: its size and, when its section holds data, where that is. */
static int elf_global(const unsigned char *p, size_t len, const char *name, size_t *bytes, const void **init)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)p;
    if (eh->e_shoff + (uint64_t)eh->e_shnum * eh->e_shentsize > len)
        return 0;
    for (uint64_t i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = elf_section(p, i);
        if (sh->sh_type != SHT_SYMTAB)
            continue;
        if (sh->sh_link >= eh->e_shnum || sh->sh_offset + sh->sh_size > len)
            return 0;
        const Elf64_Shdr *strtab = elf_section(p, sh->sh_link);
        if (strtab->sh_offset + strtab->sh_size > len)
            return 0;
        const char *names = (const char *)p + strtab->sh_offset;
        for (uint64_t at = sh->sh_offset; at + sizeof(Elf64_Sym) <= sh->sh_offset + sh->sh_size;
             at += sizeof(Elf64_Sym)) {
            const Elf64_Sym *sym = (const Elf64_Sym *)(p + at);
            if (ELF64_ST_TYPE(sym->st_info) != STT_OBJECT || sym->st_name >= strtab->sh_size ||
                strncmp(names + sym->st_name, name, strtab->sh_size - sym->st_name) || !sym->st_shndx ||
                sym->st_shndx >= eh->e_shnum)
                continue;
            const Elf64_Shdr *sec = elf_section(p, sym->st_shndx);
            *bytes = sym->st_size;
            *init = sec->sh_type == SHT_PROGBITS && sec->sh_offset + sym->st_value + *bytes <= len
                        ? p + sec->sh_offset + sym->st_value : NULL;
            return 1;
        }
    }
    return 0;
}

/* A PTX `.global` variable: `.global [.align N] .TYPE name[COUNT]...;` (zero-initialised). */
static int ptx_global(const char *ptx, const char *name, size_t *size)
{
    size_t name_len = strlen(name);
    for (const char *line = ptx; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        if (n >= sizeof buf)
            continue;
        memcpy(buf, line, n);
        buf[n] = 0;
        if (!strstr(buf, ".global"))
            continue;
        const char *type = strstr(buf, " .b");
        for (const char *t = buf; !type && (t = strstr(t, " .")); t++)
            if (strchr("usf", t[2]) && t[3] >= '0' && t[3] <= '9')
                type = t;
        const char *at = strstr(buf, name);
        if (!type || !at || (at[name_len] != '[' && at[name_len] != ';' && at[name_len] != ' ' &&
                             at[name_len] != '=') || at[-1] != ' ')
            continue;
        size_t elem = (size_t)strtoul(type + 3, NULL, 10) / 8, count = 1;
        if (at[name_len] == '[')
            count = (size_t)strtoul(at + name_len + 1, NULL, 10);
        *size = (elem ? elem : 1) * count;
        return 1;
    }
    return 0;
}

/* A global of a cubin or of PTX text (NUL-terminated) of `len` bytes, its initial data copied. */
static int module_global(const void *image, size_t len, const char *name, size_t *bytes, void **init)
{
    const void *data = NULL;
    int found = is_elf(image) ? elf_global(image, len, name, bytes, &data) : ptx_global(image, name, bytes);
    if (found && data && *bytes && (*init = malloc(*bytes)))
        memcpy(*init, data, *bytes);
    return found;
}

int sim_image_global(const void *image, size_t len, const char *name, size_t *bytes, void **init)
{
    *init = NULL;
    if (image_magic(image) != FATBIN_MAGIC)
        return module_global(image, len, name, bytes, init);
    unsigned char *module;
    size_t module_len;
    int kind, found = 0;
    if (len >= sizeof(struct fatbin_header) && len >= sim_image_size(image) &&
        fatbin_module(image, &module, &module_len, &kind) == CUDA_SUCCESS && module) {
        found = module_global(module, module_len, name, bytes, init);
        free(module);
    }
    return found;
}

CUresult sim_image_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char *buf = NULL;
    size_t n_read = 0, cap = 0, n;
    do {
        if (n_read + 65536 + 1 > cap) {
            char *grown = realloc(buf, cap = 2 * cap + 65536 + 1);
            if (!grown) {
                free(buf);
                fclose(f);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            buf = grown;
        }
        n = fread(buf + n_read, 1, 65536, f);
        n_read += n;
    } while (n > 0);
    fclose(f);
    buf[n_read] = 0;                     /* PTX files need not end in a NUL */
    *data = buf;
    *len = n_read;
    return CUDA_SUCCESS;
}
