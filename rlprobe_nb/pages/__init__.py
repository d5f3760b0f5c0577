"""The book's pages: what the exporter adds to an executed notebook's HTML, and the index.

  charts       altair charts interactive offline (the Vega scripts inlined once a page)
  code_cells   input cells hidden by cell tags, with a "show code" switch
  navigation   the order of the pages, previous / next links, the suite's index page
  headlines    each chapter's headline numbers, read from its tables, for the index

``book`` runs the notebooks and calls these when it exports each page.
"""
