"""Model families behind the contract (`streamvox.contract.Runner`); `registry` picks one by name."""
