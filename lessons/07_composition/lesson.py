# %% [markdown]
# # Lesson 07 — 3-D composition and topology
#
# stub
