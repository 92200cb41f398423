# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 05 — Pipeline parallelism
#
# Placeholder.

# %%
print("placeholder")

# %% [markdown]
# ## Exercises
#
# ## Summary
