"""Learned heads on a draft's hidden state that predict whether the target would accept the
token the draft just proposed: SPRINTER's verifier and SpecDec++'s acceptance head
(ALGORITHMS.md §4-5). `tandem calibrate` (engine/tools/calibrate/) trains them per pair."""
