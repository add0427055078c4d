"""Server-rendered pages beyond the live console: teams and their paging (policy, contacts,
shifts, test pages), silences, the incidents list and the audit trail.

Every form posts to its page, which calls the same service function the REST API calls
(``save_policy``, ``set_contact``, ``create_shift``, ``create_silence`` …): the rules live
there once, and a refusal or a bad field comes back as the service's own sentence.
"""
