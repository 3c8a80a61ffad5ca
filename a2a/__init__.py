"""The toolkit around the protocol core (eval.py): the human face, kernel timelines, the speed-of-light model of
this machine, anchors, plots and version diffs."""
