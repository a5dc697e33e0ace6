//! softmm against models: the proptest sequences checked against the
//! reference model (`softmm_testkit::reference`), the fuzz targets' corpora
//! replayed through their harness (`softmm_testkit::fuzz_ops`), and the
//! regressions both found.

mod fuzz_corpus;
mod fuzz_findings;
mod model;
mod model_regressions;
