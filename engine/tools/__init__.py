"""Offline tools above the decoding core: `tandem bench`, `distill`, `calibrate`,
`ngram-table` and `export-gguf`. They import the core; the core never imports them."""
