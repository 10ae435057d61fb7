# filled by the tests author
