"""`scalelab recommend`: which strategy, layout, batch split and LR rule to run, with evidence.

space.py enumerates the layouts the trainer can run and prunes those that do not fit device memory
(the planner, plan/); rank.py orders them by the planner's prediction for an objective and says
what bounds each; recommend.py keeps the ones the trainer's own validation accepts, verifies the
top K with short real runs (verify.py: one `scalelab-train -m` multirun) and re-ranks on measured
figures; lr.py answers the LR rule and warmup and runs the short LR check; report.py writes
recommendation.json / .md / .html; published.py holds the published Megatron-LM and ZeRO
configurations the recommender is checked against; cli.py is the argparse wiring.
"""
