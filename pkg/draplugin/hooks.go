package draplugin

// HookPoint names a step of prepare or unprepare at which a test may stop
// the plugin (crash-point injection). Production code passes no hook.
type HookPoint string

const (
	// HookPrepareStart is passed when a prepare call reaches the plugin,
	// after the helper read its claims.
	HookPrepareStart HookPoint = "prepare-start"
	// HookBeforeSave and HookAfterSave surround the checkpoint save that
	// records a batch's seats.
	HookBeforeSave    HookPoint = "before-save"
	HookAfterSave     HookPoint = "after-save"
	HookAfterCDIWrite HookPoint = "after-cdi-write"
	// HookAfterStatusWrite is passed in the background, after a claim's
	// status got its seats, once the prepare was answered.
	HookAfterStatusWrite   HookPoint = "after-status-write"
	HookAfterCDIRemove     HookPoint = "after-cdi-remove"
	HookAfterUnprepareSave HookPoint = "after-unprepare-save"
)

type hooks func(HookPoint)

func (h hooks) run(p HookPoint) {
	if h != nil {
		h(p)
	}
}
