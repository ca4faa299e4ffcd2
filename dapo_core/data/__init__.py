"""Problems: named data sets, the user's files, the embedded synthetic task."""
