"""The paper's math as pure torch functions, found by name in small registries."""
