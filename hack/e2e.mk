# Targets for the manager image and the end-to-end run on a real node.
# Included by the Makefile.
