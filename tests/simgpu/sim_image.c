/*
 * Module images: what kind an image is and which kernels it holds, read the
 * way the driver reads them (nothing is compiled or run).
 *
 * - fat binary: the wrapper the compiler emits (magic 0x466243B1, pointing at
 *   the fat binary) or the fat binary itself (magic 0xBA55ED50, a 16-byte
 *   header, then entries: a header of `header_size` bytes, then
 *   `payload_size` bytes of PTX text or an ELF cubin). Compressed entries
 *   (LZ4/Zstandard) are not decompressed: an image with one is "opaque" and
 *   any kernel name resolves in it.
 * - ELF cubin: the kernels are its global function symbols.
 * - PTX text: the kernels are its `.entry` directives.
 * - anything else is a simulator test image (a short string such as "any
 *   image"): it holds the test kernels `spin`, `sleep_kernel` and `empty`.
 * A test kernel's first parameter is its duration in microseconds, in whatever
 * image it is (cu_launch.c).
 */
#include "sim.h"

#include <ctype.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u
#define ENTRY_PTX 1
#define ENTRY_ELF 2
#define ENTRY_COMPRESSED (0x2000ull | 0x8000ull)  /* LZ4, Zstandard */

struct fatbin_wrapper { uint32_t magic, version; const void *data; const void *prelinked; };
struct fatbin_header { uint32_t magic; uint16_t version, header_size; uint64_t size; };
struct fatbin_entry {
    uint16_t kind, version;
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t compressed_size, unknown1, unknown2, sm_version, bit_width, unknown3;
    uint64_t flags;
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

/* Global functions of a 64-bit ELF; `len` bounds every read (SIZE_MAX: trust the headers). */
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
            if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || ELF64_ST_BIND(sym[k].st_info) != STB_GLOBAL ||
                sym[k].st_name >= strtab->sh_size)
                continue;
            const char *name = names + sym[k].st_name;
            if (add_name(img, name, strnlen(name, strtab->sh_size - sym[k].st_name)) < 0)
                return -1;
        }
    }
    return 0;
}

static int parse_fatbin(const struct fatbin_header *fh, struct sim_image *img)
{
    if (fh->version != 1 || fh->header_size < sizeof *fh)
        return -1;
    const unsigned char *p = (const unsigned char *)fh + fh->header_size, *end = p + fh->size;
    while (p + sizeof(struct fatbin_entry) <= end) {
        const struct fatbin_entry *e = (const struct fatbin_entry *)p;
        if (e->header_size < sizeof *e || e->payload_size > (uint64_t)(end - p) - e->header_size)
            return -1;
        const unsigned char *payload = p + e->header_size;
        if (e->flags & ENTRY_COMPRESSED)
            img->opaque = 1;
        else if (e->kind == ENTRY_PTX && parse_ptx((const char *)payload, e->payload_size, img) < 0)
            return -1;
        else if (e->kind == ENTRY_ELF && parse_elf(payload, e->payload_size, img) < 0)
            return -1;
        p = payload + e->payload_size;
    }
    return 0;
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
    if (magic == WRAPPER_MAGIC) {
        const struct fatbin_wrapper *w = image;
        img->kind = SIM_IMAGE_FATBIN;
        if (!w->data || ((const struct fatbin_header *)w->data)->magic != FATBIN_MAGIC)
            return CUDA_ERROR_INVALID_IMAGE;
        rc = parse_fatbin(w->data, img);
    } else if (magic == FATBIN_MAGIC) {
        img->kind = SIM_IMAGE_FATBIN;
        rc = parse_fatbin(image, img);
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

int sim_image_global(const void *image, size_t len, const char *name, size_t *bytes, const void **init)
{
    *init = NULL;
    if (is_elf(image))
        return elf_global(image, len, name, bytes, init);
    if (image_magic(image) == FATBIN_MAGIC)
        return 0;
    return ptx_global(image, name, bytes);
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
