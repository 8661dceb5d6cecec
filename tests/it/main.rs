mod scrape_while_stalled;
