/*
 * A tiny emulator on softmm's C API: a loader maps a text page (written,
 * then made read+exec as an ELF loader would) and a data page, an
 * interpreter loop fetches and executes 4-byte toy instructions through a
 * CPU, one access section per basic block, and guest faults become guest
 * signals: a store into the text page
 * and a load from a hole are skipped like a SIGSEGV handler would, a jump
 * into the data page stops the guest. Then the guest forks (copy on
 * write), prints its regions and counters, and everything is freed with
 * no leak.
 *
 * Build: cc -I include examples/emulator.c libsoftmm_capi.a -lpthread -ldl -lm
 * (crates/softmm-capi/tests/c.rs builds and runs it in the test suite.)
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_GROWSDOWN, MREMAP_MAYMOVE under -std=c11 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "softmm.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        long long r_ = (call);                                                         \
        if (r_ < 0) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, strerror((int)-r_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

enum { HALT, LI, LD, ST, ADD, ADDI, BNZ, JR };
#define INSN(op, rd, rs, imm) \
    ((uint32_t)(op) | (uint32_t)(rd) << 8 | (uint32_t)(rs) << 12 | (uint32_t)(uint16_t)(imm) << 16)

struct vcpu {
    softmm_cpu *cpu;
    uint64_t r[16];
    uint64_t pc;
};

/* Runs until HALT (0) or a fault (SOFTMM_FAULTED, with pc at the faulting
 * instruction, as a precise exception leaves it). Each basic block runs in
 * one access section (its accesses pay the TLB lookup alone); the section
 * ends at a taken branch and before returning, so the thread never blocks
 * with one open. */
static int run(struct vcpu *v, softmm_fault *f) {
    softmm_section *s;
    int rc;
    CHECK(softmm_cpu_section_begin(v->cpu, &s));
    for (;;) {
        uint64_t insn;
        rc = softmm_section_fetch_uint(s, v->pc, 4, &insn, f);
        if (rc != 0)
            break;
        unsigned op = insn & 0xff, rd = insn >> 8 & 15, rs = insn >> 12 & 15;
        int64_t imm = (int16_t)(insn >> 16);
        int block_end = 0;
        v->pc += 4;
        switch (op) {
        case HALT: CHECK(softmm_section_end(s)); return 0;
        case LI: v->r[rd] = (uint64_t)imm; break;
        case LD: rc = softmm_section_read_uint(s, v->r[rs], 8, &v->r[rd], f); break;
        case ST: rc = softmm_section_write_uint(s, v->r[rd], 8, v->r[rs], f); break;
        case ADD: v->r[rd] += v->r[rs]; break;
        case ADDI: v->r[rd] += (uint64_t)imm; break;
        case BNZ: if (v->r[rd] != 0) { v->pc += (uint64_t)(imm * 4) - 4; block_end = 1; } break;
        case JR: v->pc = v->r[rd]; block_end = 1; break;
        default: fprintf(stderr, "illegal instruction %#llx\n", (unsigned long long)insn); exit(1);
        }
        if (rc != 0) {
            v->pc -= 4;
            break;
        }
        if (block_end) { /* the next block, in a new section */
            CHECK(softmm_section_end(s));
            CHECK(softmm_cpu_section_begin(v->cpu, &s));
        }
    }
    CHECK(softmm_section_end(s));
    return rc;
}

static const char *code_name(const softmm_fault *f) {
    if (f->signo == SIGSEGV)
        return f->code == 1 ? "SEGV_MAPERR" : f->code == 2 ? "SEGV_ACCERR" : "SI_KERNEL";
    return f->code == 1 ? "BUS_ADRALN" : "BUS_ADRERR";
}

int main(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    CHECK(softmm_phys_new(4 << 20, &phys));
    CHECK(softmm_mm_new(phys, &mm));

    /* The loader: text written while writable, then read+exec. */
    const uint32_t program[] = {
        INSN(LI, 3, 0, 10),   /* r3 = 10 */
        INSN(LI, 4, 0, 0),    /* r4 = 0 */
        INSN(ADD, 4, 3, 0),   /* loop: r4 += r3 */
        INSN(ADDI, 3, 0, -1), /* r3 -= 1 */
        INSN(BNZ, 3, 0, -2),  /* until r3 == 0 */
        INSN(ST, 1, 4, 0),    /* data[0] = r4 */
        INSN(ST, 2, 4, 0),    /* text[0] = r4: SEGV_ACCERR */
        INSN(LD, 5, 6, 0),    /* r5 = *hole: SEGV_MAPERR */
        INSN(JR, 1, 0, 0),    /* jump into data: SEGV_ACCERR on the fetch */
    };
    long long text = softmm_mmap(mm, 0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    long long data = softmm_mmap(mm, 0, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    long long stack = softmm_mmap(mm, 0, 16 * 4096, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN, NULL, 0);
    CHECK(text);
    CHECK(data);
    CHECK(stack);
    CHECK(softmm_munmap(mm, (uint64_t)data + 4096, 4096)); /* the hole */
    CHECK(softmm_mm_set_start_stack(mm, (uint64_t)stack + 16 * 4096 - 64));

    struct vcpu v = {0};
    CHECK(softmm_cpu_new(mm, &v.cpu));
    softmm_fault f;
    if (softmm_cpu_write(v.cpu, (uint64_t)text, program, sizeof program, &f) != 0)
        return 1;
    CHECK(softmm_mprotect(mm, (uint64_t)text, 4096, PROT_READ | PROT_EXEC));

    v.pc = (uint64_t)text;
    v.r[1] = (uint64_t)data;
    v.r[2] = (uint64_t)text;
    v.r[6] = (uint64_t)data + 4096;
    for (;;) {
        int rc = run(&v, &f);
        CHECK(rc);
        if (rc == 0) {
            printf("guest halted\n");
            break;
        }
        printf("guest signal %d %s at %#llx, pc %#llx\n", f.signo, code_name(&f), (unsigned long long)f.addr,
               (unsigned long long)v.pc);
        if (f.addr == v.pc) {
            printf("guest killed: fetch from a non-executable page\n");
            break;
        }
        v.pc += 4; /* the guest's handler skips the faulting instruction */
    }

    uint64_t sum;
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)data, 8, &sum, &f));
    printf("sum = %llu\n", (unsigned long long)sum);

    /* fork: the child's CPU (a second one on this thread) writes its copy. */
    softmm_mm *child;
    softmm_cpu *ccpu;
    CHECK(softmm_mm_fork(mm, &child));
    CHECK(softmm_cpu_new(child, &ccpu));
    CHECK(softmm_cpu_write_uint(ccpu, (uint64_t)data, 8, 99, &f));
    uint64_t in_parent, in_child;
    CHECK(softmm_cpu_read_uint(v.cpu, (uint64_t)data, 8, &in_parent, &f));
    CHECK(softmm_cpu_read_uint(ccpu, (uint64_t)data, 8, &in_child, &f));
    printf("after fork: parent %llu, child %llu\n", (unsigned long long)in_parent, (unsigned long long)in_child);

    /* The regions, as /proc/pid/maps lines, from the structured call:
     * ask for the count, then fill an array that size (a mapping made
     * between the two calls would make the second -ERANGE: call again). */
    size_t count = 0;
    CHECK(softmm_mm_regions(mm, NULL, sizeof(softmm_region), &count));
    softmm_region *regions = calloc(count, sizeof *regions);
    if (!regions)
        return 1;
    CHECK(softmm_mm_regions(mm, regions, sizeof *regions, &count));
    for (size_t i = 0; i < count; i++) {
        const softmm_region *r = &regions[i];
        printf("%08llx-%08llx %c%c%c%c %08llx %5llu KiB resident %s\n", (unsigned long long)r->start,
               (unsigned long long)r->end, r->prot & PROT_READ ? 'r' : '-', r->prot & PROT_WRITE ? 'w' : '-',
               r->prot & PROT_EXEC ? 'x' : '-', r->flags & MAP_SHARED ? 's' : 'p', (unsigned long long)r->offset,
               (unsigned long long)(r->rss >> 10), r->name);
    }
    free(regions);

    /* The counters an embedder watches: faults and TLB misses of a CPU,
     * shootdowns of the address space. */
    softmm_cpu_stats cs = {.size = sizeof cs};
    softmm_mm_stats ms = {.size = sizeof ms};
    CHECK(softmm_cpu_get_stats(v.cpu, &cs));
    CHECK(softmm_mm_get_stats(mm, &ms));
    printf("cpu: %llu faults, %llu TLB misses; mm: %llu VMAs, %llu resident pages, %llu TLB shootdowns\n",
           (unsigned long long)cs.faults, (unsigned long long)cs.tlb_misses, (unsigned long long)ms.map_count,
           (unsigned long long)ms.rss_pages, (unsigned long long)ms.tlb_flushes);

    CHECK(softmm_cpu_free(ccpu));
    CHECK(softmm_cpu_free(v.cpu));
    softmm_mm_free(child);
    softmm_mm_free(mm);
    softmm_phys_stats s;
    CHECK(softmm_phys_get_stats(phys, &s));
    printf("leaked: %llu frames, %llu page tables, %llu VMAs\n", (unsigned long long)s.frames_used,
           (unsigned long long)s.page_tables, (unsigned long long)s.vmas);
    softmm_phys_free(phys);
    return 0;
}
