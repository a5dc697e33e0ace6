//! The seeds: the five Linux mm patch series whose mechanisms softmm
//! implements beside the design each one replaced, with where to read them;
//! and what every policy name the lab prints means.

/// One patch series.
pub struct Seed {
    /// `000` to `004`.
    pub number: &'static str,
    /// A short name, as the per-seed rows print it.
    pub name: &'static str,
    /// The series' subject line.
    pub title: &'static str,
    /// Its author.
    pub author: &'static str,
    /// When it was posted.
    pub date: &'static str,
    /// Where to read it.
    pub url: &'static str,
    /// The mechanism, in one sentence.
    pub mechanism: &'static str,
    /// The lab's experiment for it.
    pub experiment: &'static str,
    /// softmm's policy for the design before the series, and its default.
    pub old_new: (&'static str, &'static str),
}

/// The seeds, in order.
pub const SEEDS: [Seed; 5] = [
    Seed {
        number: "000",
        name: "hugetlb PMD sharing",
        title: "[RFC PATCH v4 0/8] hugetlb: Change huge pmd sharing synchronization again",
        author: "Mike Kravetz",
        date: "2022-07-06",
        url: "https://lore.kernel.org/linux-mm/?q=s%3A%22Change+huge+pmd+sharing+synchronization+again%22",
        mechanism: "hugetlb faults stop taking the file-wide i_mmap_rwsem, which serialized the faults of \
                    every process sharing PMD tables of one hugetlbfs file, and take a per-VMA lock instead",
        experiment: "softmm bench hugetlb-fault,hugetlb-fork,hugetlb-fork-fault",
        old_new: ("i-mmap-rwsem", "lock-free"),
    },
    Seed {
        number: "001",
        name: "speculative faults",
        title: "[RFC PATCH 00/37] Speculative page faults",
        author: "Michel Lespinasse",
        date: "2021-04-07",
        url: "https://lore.kernel.org/linux-mm/?q=s%3A%22Speculative+page+faults%22+a%3Alespinasse",
        mechanism: "page faults run without mmap_lock and commit only if a sequence count shows that no \
                    mmap_lock writer ran meanwhile, so faults stop waiting behind mmap and munmap",
        experiment: "softmm bench (the headline: pft and interference)",
        old_new: ("mmap-lock", "per-vma-seq"),
    },
    Seed {
        number: "002",
        name: "big munmap",
        title: "[RFC PATCH 0/8] Drop mmap_sem during unmapping large map",
        author: "Yang Shi",
        date: "2018-03",
        url: "https://lore.kernel.org/linux-mm/?q=s%3A%22Drop+mmap_sem+during+unmapping+large+map%22",
        mechanism: "a large munmap releases mmap_sem between 1 GiB sections instead of holding it for \
                    write across the whole unmap, so other threads' faults and mmaps stop waiting for it",
        experiment: "softmm bench big-munmap",
        old_new: ("locked", "lock-free"),
    },
    Seed {
        number: "003",
        name: "batched migration",
        title: "[PATCH -v5 0/9] migrate_pages(): batch TLB flushing",
        author: "Huang Ying",
        date: "2023-02-13",
        url: "https://lore.kernel.org/linux-mm/?q=s%3A%22migrate_pages%28%29%3A+batch+TLB+flushing%22",
        mechanism: "migrate_pages unmaps a batch of pages, flushes the TLBs once, then copies and remaps \
                    them, instead of one TLB-flush IPI per page",
        experiment: "softmm bench migrate",
        old_new: ("one-by-one", "batched"),
    },
    Seed {
        number: "004",
        name: "page pinning",
        title: "[RFC PATCH v4 09/13] vfio: relieve mmap_sem reader cacheline bouncing by holding it longer",
        author: "Daniel Jordan",
        date: "2018-11-05",
        url: "https://lore.kernel.org/linux-mm/?q=s%3A%22relieve+mmap_sem+reader+cacheline+bouncing%22",
        mechanism: "pinning a guest's memory for a device holds mmap_sem across a batch of pages instead of \
                    taking it for every page, in a series that pins with many threads at once (ktask)",
        experiment: "softmm bench pin",
        old_new: ("per-page", "per-vma"),
    },
];

/// The seed numbered `number`.
pub fn seed(number: &str) -> &'static Seed {
    SEEDS.iter().find(|s| s.number == number).expect("one of the five seeds")
}

/// What a policy name means: `(name, kind, meaning)`.
pub const POLICIES: &[(&str, &str, &str)] = &[
    ("mmap-lock", "fault", "every fault takes mmap_lock for read (Linux before 6.4; seed 001's old design)"),
    ("speculative", "fault", "seed 001: no lock, validated against the address space's sequence count"),
    ("per-vma", "fault", "a read reference on the faulting VMA instead of mmap_lock (Linux 6.4+ per-VMA locks)"),
    ("per-vma-seq", "fault", "validated against the VMA's own detached bit, with no shared write (softmm's default)"),
    (
        "reserve",
        "writers",
        "every unmap past 2 MiB reserves its range, touched or not (3 write sections per mmap1 op); writers park",
    ),
    (
        "short",
        "writers",
        "an unmap with no page table to zap ends in its first write section (2 per mmap1 op, as Linux)",
    ),
    ("short-spin", "writers", "short, and a writer spins (bounded) while mmap_lock is held before parking"),
    (
        "short-collect",
        "writers",
        "short, and a writer flushes its epoch bag and collects after publishing (faults collect less of its garbage)",
    ),
    (
        "short-own-rcu",
        "writers",
        "short, and a writer frees its own old VMA versions after their grace period (faults never free them; softmm's default)",
    ),
    (
        "range",
        "writers",
        "range-parallel writers: mmap (anonymous and page-cache files), munmap, mprotect, madvise (VMA flags) and mremap inside one 1 GiB window run without mmap_lock",
    ),
    ("locked", "unmap", "the whole munmap under mmap_lock held for write (Linux before 4.20; seed 002's old design)"),
    ("sectioned", "unmap", "seed 002: the write lock dropped between 1 GiB sections"),
    ("downgrade", "unmap", "VMAs detached under the write lock, the zap under the read lock (Linux 4.20+)"),
    ("lock-free", "unmap", "the zap with no mmap_lock at all (softmm's default)"),
    ("per-page", "pin", "mmap_lock for read around every page pinned (VFIO before seed 004)"),
    ("batched", "pin", "seed 004: mmap_lock for read held across 512 pages (VFIO since Linux 5.12)"),
    ("per-vma", "pin", "gup-fast and lock-free faults, no mmap_lock per page (softmm's default)"),
    ("i-mmap-rwsem", "hugetlb", "every hugetlb fault reads the file's i_mmap lock (Linux 5.7-6.0; seed 000's old)"),
    ("vma-lock", "hugetlb", "seed 000 (Linux 6.1+): a per-VMA hugetlb lock; i_mmap only to share a PMD table"),
    ("lock-free", "hugetlb", "no shared lock: the fault validates that its PMD table is still linked (default)"),
    ("one-by-one", "migrate", "unmap, flush, copy and remap one page at a time (before Linux 6.3)"),
    ("batched", "migrate", "seed 003: up to 512 pages unmapped, one flush, then copied and remapped (default)"),
    ("linux", "placement", "non-fixed mmap placed top-down below mmap_base, as Linux (default; rows unsuffixed)"),
    ("arenas", "placement", "non-fixed mmap placed first in the calling thread's 1 GiB arena, then as Linux"),
    ("broadcast", "targets", "a shootdown asks every attached CPU of another thread (softmm before issue 26)"),
    ("fill-owners", "targets", "a zap's or COW's shootdown asks only the CPUs that filled from its entries (default)"),
    ("fill-owners-ranges", "targets", "fill-owners, each request naming its pages (up to 32): targets keep the rest"),
    (
        "locked",
        "posting",
        "a shootdown posts, runs its barrier and looks at each CPU under the CPU-list lock (the first)",
    ),
    ("lock-free", "posting", "the CPU list read from an epoch-published copy, no lock; one barrier per shootdown"),
    ("shared-barrier", "posting", "lock-free, and one membarrier covers every initiator that posted before it began"),
    ("adaptive", "posting", "shared-barrier; CPUs shot down often fence their own sections: no membarrier (default)"),
    ("madvise-mmap-lock", "madvise", "MADV_DONTNEED and MADV_FREE under mmap_lock for read (Linux before 6.16)"),
    ("madvise-per-vma", "madvise", "a range in one VMA under its read reference, no mmap_lock (Linux 6.16+; default)"),
    ("atomics-strict", "atomics", "an unaligned atomic faults with SIGBUS/BUS_ADRALN, as on aarch64 (default)"),
    ("atomics-split", "atomics", "x86's split locks: a CAS loop inside a word, the split lock across words or pages"),
    ("host", "every", "the running Linux kernel doing the same work (processes, io_uring, /proc)"),
];

/// The policies of one kind (`fault`, `targets`, `unmap`, `pin`, `hugetlb`, `migrate`).
pub fn names(kind: &str) -> Vec<&'static str> {
    POLICIES.iter().filter(|p| p.1 == kind).map(|p| p.0).collect()
}

/// What `name`, a policy of `kind`, means (`host` for every kind).
#[cfg(test)]
pub fn gloss(kind: &str, name: &str) -> Option<&'static str> {
    POLICIES.iter().find(|p| p.0 == name && (p.1 == kind || p.1 == "every")).map(|p| p.2)
}

/// `name = meaning` lines for the policies of `kind` named in `names`, in
/// the glossary's order, wrapped to 100 columns: the policy legend under a
/// table.
pub fn legend(kind: &str, names: &[&str]) -> String {
    legend_at(kind, names, "  ")
}

/// [`legend`] with each line indented by `indent`.
fn legend_at(kind: &str, names: &[&str], indent: &str) -> String {
    let mut out = String::new();
    for (name, k, what) in POLICIES {
        if (*k == kind || *k == "every") && names.contains(name) {
            out.push_str(&crate::table::wrap(&format!("{indent}{name}: {what}"), &format!("{indent}    ")));
        }
    }
    out
}

/// `softmm bench --help`'s text after the options: the policies of each
/// workload, the seeds and three examples.
pub fn bench_help() -> String {
    let mut out = String::from(
        "Workloads and their policies (--policy: names, comma-separated, or all, default, host):\n\
         \x20 pft, page-fault1..3, mmap1..2, tlb-flush, interference, cortenmm: fault policies, or writer\n\
         \x20   policies (the default fault policy with another way to run mmap_lock writers)\n",
    );
    let kinds = [
        ("fault", ""),
        ("targets", "  any of those, tlb-flush above all: shootdown-target policies, faults under the default\n"),
        ("writers", ""),
        ("unmap", "  big-munmap (seed 002): unmap policies, faults under mmap-lock\n"),
        ("pin", "  pin (seed 004): pin policies\n"),
        ("hugetlb", "  hugetlb-fault, hugetlb-fork, hugetlb-fork-fault (seed 000): hugetlb policies\n"),
        ("migrate", "  migrate (seed 003): migrate policies\n"),
        ("posting", "  --posting (issue 26), for every softmm address space: shootdown posting policies\n"),
        ("madvise", "  tlb-flush --madvise all: madvise policies, faults under the default fault policy\n"),
        (
            "atomics",
            "  any of those: atomic-alignment policies, faults under the default (the atomics' own cost:\n\
             \x20   cargo bench -p softmm --bench mmu atomics)\n",
        ),
    ];
    for (kind, head) in kinds {
        out.push_str(head);
        let mut names = names(kind);
        names.retain(|n| *n != "host");
        out.push_str(&legend_at(kind, &names, "      "));
    }
    out.push_str(&crate::table::wrap(
        "  placement (--placement, for the fault-policy workloads; a row's policy gets `+name` when not \
         linux):",
        "      ",
    ));
    out.push_str(&legend_at("placement", &names("placement"), "      "));
    out.push_str(&crate::table::wrap(
        "  host: the running kernel doing the same work, a row beside every workload's policies \
         (--no-host leaves it out)",
        "      ",
    ));
    out.push_str(
        "\nThe seeds (Linux mm patch series; each experiment compares the design before the series\n\
         with softmm's default and the host):\n",
    );
    for s in &SEEDS {
        out.push_str(&crate::table::wrap(
            &format!("  {} {}: \"{}\", {}, {}", s.number, s.name, s.title, s.author, s.date),
            "      ",
        ));
        out.push_str(&format!("      {}\n", s.url));
        out.push_str(&crate::table::wrap(
            &format!("      {}; the lab's experiment: {}.", s.mechanism, s.experiment),
            "      ",
        ));
    }
    out.push_str(
        "\nExamples:\n\
         \x20 softmm bench                                    # the headline: pft, interference, per-seed rows\n\
         \x20 softmm bench pft,interference --policy mmap-lock,per-vma-seq --threads 1,2 --plot out.svg\n\
         \x20 softmm bench big-munmap --size 2G --threads 1 --policy locked,lock-free --json out.json\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_of_the_library_is_glossed() {
        for p in softmm::FaultPolicy::ALL {
            assert!(gloss("fault", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::UnmapPolicy::ALL {
            assert!(gloss("unmap", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::PinPolicy::ALL {
            assert!(gloss("pin", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::HugetlbPolicy::ALL {
            assert!(gloss("hugetlb", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::MigratePolicy::ALL {
            assert!(gloss("migrate", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::PlacementPolicy::ALL {
            assert!(gloss("placement", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::ShootdownTargets::ALL {
            assert!(gloss("targets", p.name()).is_some(), "{}", p.name());
        }
        for p in softmm::PostingPolicy::ALL {
            assert!(gloss("posting", p.name()).is_some(), "{}", p.name());
        }
        for &p in softmm::MadvisePolicy::ALL {
            let row = crate::workloads::Backend::Madvise(p).name();
            assert!(gloss("madvise", row).is_some(), "{row}");
        }
        assert!(gloss("pin", "host").is_some());
    }

    #[test]
    fn the_old_and_new_designs_are_the_library_policies_and_defaults() {
        assert_eq!(seed("000").old_new.1, softmm::HugetlbPolicy::default().name());
        assert_eq!(seed("001").old_new.1, softmm::FaultPolicy::default().name());
        assert_eq!(seed("002").old_new.1, softmm::UnmapPolicy::default().name());
        assert_eq!(seed("003").old_new.1, softmm::MigratePolicy::default().name());
        assert_eq!(seed("004").old_new.1, softmm::PinPolicy::default().name());
    }

    #[test]
    fn the_help_fits_100_columns() {
        for l in bench_help().lines() {
            assert!(l.chars().count() <= 100, "{} columns: {l}", l.chars().count());
        }
    }
}
