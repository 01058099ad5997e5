package draplugin

// HookPoint names a step of prepare or unprepare at which a test may stop
// the plugin (crash-point injection). Production code passes no hook.
type HookPoint string

const (
	HookBeforeStartedSave  HookPoint = "before-started-save"
	HookAfterStartedSave   HookPoint = "after-started-save"
	HookAfterCDIWrite      HookPoint = "after-cdi-write"
	HookAfterStatusWrite   HookPoint = "after-status-write"
	HookAfterCompletedSave HookPoint = "after-completed-save"
	HookAfterCDIRemove     HookPoint = "after-cdi-remove"
	HookAfterUnprepareSave HookPoint = "after-unprepare-save"
)

// HookPoints lists every point, in the order a prepare and an unprepare
// pass them.
var HookPoints = []HookPoint{
	HookBeforeStartedSave, HookAfterStartedSave, HookAfterCDIWrite, HookAfterStatusWrite,
	HookAfterCompletedSave, HookAfterCDIRemove, HookAfterUnprepareSave,
}

type hooks func(HookPoint)

func (h hooks) run(p HookPoint) {
	if h != nil {
		h(p)
	}
}
